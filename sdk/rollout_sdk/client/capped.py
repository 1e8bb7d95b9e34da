"""Every answer the SDK's HTTP clients read, read against a cap.

An answer comes from an address a trainer chose: it may be any size, compressed a thousand to
one, or trickled. :class:`CappedTransport` sits under every client of
:func:`~rollout_sdk.client.new_http_client` (the v1 TrainGate client and the integrations'
OpenAI clients alike) and hands its caller the body decoded, in chunks, never more than
``max_answer_mb`` of it (raw or decoded: ``gzip`` and ``deflate`` are decoded here, a
kilobyte at a time per chunk read, so a bomb never expands past the cap; any other
``Content-Encoding`` is refused), and never while the process's answers being read hold more
than ``answers_in_flight_mb`` together. Past either, the read fails with
:class:`AnswerRefused`, one line naming the cap and its setting. A slow answer is the
client's timeouts' to end.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar

import httpx

from rollout_sdk.config import RolloutClientSettings
from rollout_sdk.core.foreign import named

MIB = 1024 * 1024
# A compressed chunk expands in steps of this many bytes, each checked against the cap.
_STEP = 64 * 1024
_DECODED = frozenset({"gzip", "x-gzip", "deflate"})
CAP_SETTING = "OSMOSIS_ROLLOUT_CLIENT_MAX_ANSWER_MB"
IN_FLIGHT_SETTING = "OSMOSIS_ROLLOUT_CLIENT_ANSWERS_IN_FLIGHT_MB"
ROLLOUT_SETTING = "OSMOSIS_ROLLOUT_CLIENT_MAX_ROLLOUT_ANSWERS_MB"


class AnswerRefused(httpx.DecodingError):
    """An answer the SDK would not read to its end: over its cap, or encoded in a way the SDK
    does not decode. Its message is the SDK's own words (the request and the cap), never the
    answer's bytes (``rollout_sdk.core.foreign``)."""

    own_words = True
    retryable = False

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code  # the answer's, whose body was refused

    @classmethod
    def over(cls, request: httpx.Request, status_code: int, cap: int) -> AnswerRefused:
        return cls(
            f"{named(request)}: the answer is over {cap // MIB} MiB ({CAP_SETTING})", status_code
        )


class AnswersInFlightFull(AnswerRefused):
    """The process already holds its budget of answers being read: the same request may fit
    a moment later."""

    retryable = True


class InFlightBudget:
    """Bytes of answers being read now, across every client of the process (any thread)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, count: int) -> bool:
        with self._lock:
            if self.held + count > self.limit:
                return False
            self.held += count
            return True

    def give(self, count: int) -> None:
        with self._lock:
            self.held -= count


class RolloutAnswers:
    """What one rollout's answers may add up to: everything it keeps (its messages, its
    turns' token ids) and will store comes from them, over every turn and retry."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.read = 0


_rollout: ContextVar[RolloutAnswers | None] = ContextVar("rollout_answers", default=None)


@contextlib.contextmanager
def reading_answers(limit_mb: int) -> Iterator[RolloutAnswers]:
    """The answers read in this block (this task and the tasks it starts, through the SDK's
    clients) add up to at most ``limit_mb``: past it a call fails, naming the setting. The
    SDK's runners put each rollout in one."""
    answers = RolloutAnswers(limit_mb * MIB)
    token = _rollout.set(answers)
    try:
        yield answers
    finally:
        _rollout.reset(token)


_budgets: dict[int, InFlightBudget] = {}
_budgets_lock = threading.Lock()


def in_flight_budget(limit: int) -> InFlightBudget:
    """The process's budget of ``limit`` bytes (one per limit: clients sharing a setting share
    it)."""
    with _budgets_lock:
        budget = _budgets.get(limit)
        if budget is None:
            budget = _budgets[limit] = InFlightBudget(limit)
        return budget


class _Inflater:
    """``gzip`` or ``deflate`` (zlib-wrapped or raw, as servers send it), decoded a step at a
    time so that no chunk expands past what the cap still allows."""

    def __init__(self, encoding: str) -> None:
        self._raw_fallback = encoding == "deflate"
        wbits = zlib.MAX_WBITS | 16 if encoding in ("gzip", "x-gzip") else zlib.MAX_WBITS
        self._inflate = zlib.decompressobj(wbits)
        self._started = False

    def first(self, data: bytes) -> bytes | None:
        """The first step of ``data`` decoded; then :meth:`more` until it returns ``b""``.
        ``None`` if the data is not of its encoding."""
        try:
            piece = self._inflate.decompress(data, _STEP)
        except zlib.error:
            if self._started or not self._raw_fallback:
                return None
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            self._raw_fallback = False
            return self.first(data)
        self._started = True
        return piece

    def more(self) -> bytes:
        tail = self._inflate.unconsumed_tail
        if not tail:
            return b""
        try:
            return self._inflate.decompress(tail, _STEP) or b""
        except zlib.error:
            return b""

    def flush(self) -> bytes:
        try:
            return self._inflate.flush(_STEP)
        except zlib.error:
            return b""


class _CappedStream(httpx.AsyncByteStream):
    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        request: httpx.Request,
        status_code: int,
        encoding: str | None,
        cap: int,
        budget: InFlightBudget,
    ) -> None:
        self._inner = inner
        self._request = request
        self._status = status_code
        self._inflater = _Inflater(encoding) if encoding else None
        self._cap = cap
        self._budget = budget
        self._raw = 0
        self._decoded = 0
        self._held = 0
        # The pieces handed on so far: emptied if the read is refused, since the caller's
        # frames (kept alive by the exception's traceback, through a client's retry pause)
        # still hold them.
        self._given: list[bytearray] = []
        self._rollout = _rollout.get()

    def _over(self) -> AnswerRefused:
        return AnswerRefused.over(self._request, self._status, self._cap)

    def _charge(self, piece: bytes) -> bytearray:
        self._decoded += len(piece)
        if self._decoded > self._cap:
            raise self._over()
        if not self._budget.take(len(piece)):
            raise AnswersInFlightFull(
                f"{named(self._request)}: this process is reading "
                f"{self._budget.limit // MIB} MiB of answers already ({IN_FLIGHT_SETTING})",
                self._status,
            )
        self._held += len(piece)
        if (rollout := self._rollout) is not None:
            rollout.read += len(piece)
            if rollout.read > rollout.limit:
                raise AnswerRefused(
                    f"{named(self._request)}: this rollout's answers add up to over "
                    f"{rollout.limit // MIB} MiB ({ROLLOUT_SETTING})",
                    self._status,
                )
        given = bytearray(piece)
        self._given.append(given)
        return given

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The body, decoded, as ``bytearray`` pieces (bytes-like: what httpx and its callers
        join, decode and parse)."""
        try:
            async for piece in self._pieces():
                yield piece  # type: ignore[misc]  # a bytearray stands for bytes here
        except AnswerRefused:
            for given in self._given:
                given.clear()
            raise
        finally:
            self._given = []
            self._release()

    async def _pieces(self) -> AsyncIterator[bytearray]:
        async for chunk in self._inner:
            self._raw += len(chunk)
            if self._raw > self._cap:
                raise self._over()
            if self._inflater is None:
                yield self._charge(chunk)
                continue
            piece = self._inflater.first(chunk)
            if piece is None:
                raise AnswerRefused(
                    f"{named(self._request)}: the answer is not the encoding it declares",
                    self._status,
                )
            while piece:
                yield self._charge(piece)
                piece = self._inflater.more()
        if self._inflater is not None and (rest := self._inflater.flush()):
            yield self._charge(rest)

    def _release(self) -> None:
        if self._held:
            self._budget.give(self._held)
            self._held = 0

    async def aclose(self) -> None:
        self._release()
        await self._inner.aclose()


class CappedTransport(httpx.AsyncBaseTransport):
    """Hands on each answer decoded and capped (see the module's docstring)."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, cap_bytes: int, in_flight_bytes: int
    ) -> None:
        self._inner = inner
        self._cap = cap_bytes
        self._budget = in_flight_budget(in_flight_bytes)

    @classmethod
    def of(cls, inner: httpx.AsyncBaseTransport, client: RolloutClientSettings) -> CappedTransport:
        """``inner`` capped as the client settings say."""
        return cls(inner, client.max_answer_mb * MIB, client.answers_in_flight_mb * MIB)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        try:
            encoding = self._encoding(request, response)
            self._check_length(request, response)
        except AnswerRefused:
            await response.aclose()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        headers = response.headers.copy()
        if encoding is not None:
            del headers["content-encoding"]
            headers.pop("content-length", None)  # the decoded length differs
        stream = _CappedStream(
            response.stream, request, response.status_code, encoding, self._cap, self._budget
        )
        return httpx.Response(
            response.status_code, headers=headers, stream=stream, extensions=response.extensions
        )

    def _check_length(self, request: httpx.Request, response: httpx.Response) -> None:
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > self._cap:
            raise AnswerRefused.over(request, response.status_code, self._cap)

    @staticmethod
    def _encoding(request: httpx.Request, response: httpx.Response) -> str | None:
        """The one compression the answer declares (``None``: none). More than one, or one the
        SDK does not decode, refuses it (its name is the server's bytes: not quoted)."""
        declared = [
            part.strip().lower()
            for value in response.headers.get_list("content-encoding")
            for part in value.split(",")
        ]
        declared = [name for name in declared if name not in ("", "identity")]
        if not declared:
            return None
        if len(declared) > 1 or declared[0] not in _DECODED:
            raise AnswerRefused(
                f"{named(request)}: the answer's Content-Encoding is not gzip or deflate",
                response.status_code,
            )
        return declared[0]

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = [
    "CAP_SETTING",
    "IN_FLIGHT_SETTING",
    "MIB",
    "ROLLOUT_SETTING",
    "AnswerRefused",
    "AnswersInFlightFull",
    "CappedTransport",
    "InFlightBudget",
    "RolloutAnswers",
    "in_flight_budget",
    "reading_answers",
]
