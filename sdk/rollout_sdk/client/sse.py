"""Server-sent events, decoded incrementally: feed the bytes as they arrive, in pieces of any
size, and get each event's data as soon as its blank line has arrived.

Only ``data`` matters to an OpenAI-style stream: comment lines (``: ping``) and the other
fields (``event``, ``id``, ``retry``) are skipped; an event of several ``data`` lines joins
them with ``\\n``, as the SSE specification says. Lines may end in LF, CRLF or CR, also when
a CRLF is split between two pieces.
"""

from __future__ import annotations

_LINE_ENDS = (b"\r\n", b"\r")


class SSEDecoder:
    """The ``data`` of each complete event, in order, from the bytes fed so far."""

    def __init__(self) -> None:
        self._partial = b""  # the unfinished last line
        self._data: list[str] = []  # data lines of the event in progress

    def feed(self, chunk: bytes) -> list[str]:
        """The events completed by ``chunk`` (a blank line ends an event)."""
        text = self._partial + chunk
        # A CR at the very end may be the first half of a CRLF: wait for the next piece.
        held = b"\r" if text.endswith(b"\r") else b""
        text = text[: len(text) - len(held)]
        for ending in _LINE_ENDS:
            text = text.replace(ending, b"\n")
        *complete, rest = text.split(b"\n")
        self._partial = rest + held
        events: list[str] = []
        for line in complete:
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[str]:
        """The stream ended: an event whose blank line never came is delivered anyway."""
        events = self.feed(b"\n") if self._partial else []
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            event, self._data = "\n".join(self._data), []
            return event
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None  # a comment (empty name) or a field other than data


__all__ = ["SSEDecoder"]
