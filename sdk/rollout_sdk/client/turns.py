"""Each LLM turn of a rollout as the policy produced it: token ids, logprobs, usage — what a
trainer needs to train on the exact tokens instead of re-tokenizing the messages.

One :class:`Turn` shape for both generations. v1's TrainGate client keeps its turns itself
(:meth:`~rollout_sdk.client.OsmosisLLMClient.turns`). v2 agents talk to the TrainGate through
their framework's OpenAI client, which drops the fields the TrainGate adds to its answers; the
SDK's HTTP transport sees every answer, so it keeps them: inside :func:`recording_turns`,
every chat call sent through a client of :func:`~rollout_sdk.client.new_http_client` (the
integrations' clients are) asks for token ids and logprobs the way vLLM takes them
(``return_token_ids``, ``logprobs``; a call that sets either itself keeps its choice), and its
answer, JSON or server-sent events, is read as it passes to the caller, never held back from it.
Each answered call becomes one turn, named by its sample (the ``x-sample-id`` header, decoded:
``headers.py``).

Read from an answer (vLLM's shapes, and the v1 TrainGate dialect's top-level fields):
``prompt_token_ids``; ``choices[0].token_ids``, or ``token_ids``; ``choices[0].logprobs.content
[].logprob``, or ``logprobs`` as a list of numbers; ``usage``; ``choices[0].finish_reason``.
A stream's chunks add up (``token_ids`` and logprobs per chunk; the last ``usage`` counts).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import httpx

from rollout_sdk.client.headers import ROLLOUT_HEADER, SAMPLE_HEADER, decode_header_id
from rollout_sdk.client.sse import SSEDecoder

logger = logging.getLogger(__name__)

# What a chat call asks for, unless it says otherwise (vLLM's names).
ASKED_FIELDS: dict[str, Any] = {"return_token_ids": True, "logprobs": True}
_DONE = "[DONE]"


class Turn(TypedDict):
    """One answered LLM call (lists empty when the TrainGate did not return them)."""

    token_ids: list[int]  # the completion's tokens
    logprobs: list[float]  # one per completion token
    prompt_token_ids: list[int]
    usage: dict[str, Any]
    finish_reason: str
    latency_ms: float  # v1: the call with its retries; v2: the answered attempt, read to the end
    sample_id: NotRequired[str | None]  # v2: the sample the call belongs to (x-sample-id)


def make_turn(
    *,
    token_ids: list[int],
    logprobs: list[float],
    prompt_token_ids: list[int],
    usage: dict[str, Any],
    finish_reason: str | None,
    latency_ms: float,
) -> Turn:
    return Turn(
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=prompt_token_ids,
        usage=usage,
        finish_reason=finish_reason or "stop",
        latency_ms=round(latency_ms, 1),
    )


def _ints(value: Any) -> list[int]:
    if isinstance(value, list) and all(type(item) is int for item in value):
        return value
    return []


def _numbers(value: Any) -> list[float]:
    if isinstance(value, list) and all(type(item) in (int, float) for item in value):
        return value
    return []


def _content_logprobs(value: Any) -> list[float]:
    """``{"content": [{"token": ..., "logprob": -0.1, ...}, ...]}`` → ``[-0.1, ...]``."""
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(content, list):
        return []
    entries = [entry.get("logprob") for entry in content if isinstance(entry, dict)]
    return _numbers(entries) if len(entries) == len(content) else []


class TurnBuilder:
    """One answer's turn, from its ``chat.completion`` body or its ``chat.completion.chunk``
    events in order (only the first choice: an agent asks for one)."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.prompt_token_ids: list[int] = []
        self.usage: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.seen = False  # a body or chunk was read

    def add(self, body: Any) -> None:
        if not isinstance(body, dict):
            return
        self.seen = True
        if prompt := _ints(body.get("prompt_token_ids")):
            self.prompt_token_ids = prompt
        self.token_ids += _ints(body.get("token_ids"))  # the TrainGate's v1 dialect
        self.logprobs += _numbers(body.get("logprobs"))
        if isinstance(usage := body.get("usage"), dict):
            self.usage = usage
        choices = body.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            self.token_ids += _ints(choice.get("token_ids"))
            self.logprobs += _content_logprobs(choice.get("logprobs"))
            if isinstance(reason := choice.get("finish_reason"), str):
                self.finish_reason = reason

    def turn(self, latency_ms: float) -> Turn:
        return make_turn(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            prompt_token_ids=self.prompt_token_ids,
            usage=self.usage,
            finish_reason=self.finish_reason,
            latency_ms=latency_ms,
        )


@dataclass
class TurnRecorder:
    """The turns of one rollout, in the order their answers were read to the end."""

    turns: list[Turn] = field(default_factory=list)


_recorder: ContextVar[TurnRecorder | None] = ContextVar("rollout_sdk_turns", default=None)


@contextlib.contextmanager
def recording_turns(recorder: TurnRecorder | None = None) -> Iterator[TurnRecorder]:
    """Keep the turns of every chat call made in this block (this task and the tasks it
    starts) through the SDK's HTTP clients."""
    recorder = recorder if recorder is not None else TurnRecorder()
    token = _recorder.set(recorder)
    try:
        yield recorder
    finally:
        _recorder.reset(token)


def _is_chat(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/chat/completions")


def _asking(request: httpx.Request) -> httpx.Request:
    """``request`` with the fields it lacks of :data:`ASKED_FIELDS` (itself if none, or if
    its body is not a JSON object)."""
    try:
        body = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return request
    if not isinstance(body, dict):
        return request
    missing = {name: value for name, value in ASKED_FIELDS.items() if name not in body}
    if not missing:
        return request
    content = json.dumps({**body, **missing}, ensure_ascii=False, separators=(",", ":"))
    headers = request.headers.copy()
    del headers["content-length"]  # set again for the new body
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        content=content.encode(),
        extensions=request.extensions,
    )


class _AnswerReader:
    """Reads one answer's body as it passes: JSON at its end, SSE event by event. The turn is
    kept once: at ``[DONE]``, at the end of the body, or, when its caller closes it sooner
    (OpenAI's client stops reading at ``[DONE]``), if its finish reason had come."""

    def __init__(self, capture: TurnCapture, response: httpx.Response) -> None:
        self._capture = capture
        self._builder = TurnBuilder()
        content_type = response.headers.get("content-type", "")
        self._events = SSEDecoder() if content_type.startswith("text/event-stream") else None
        self._body = bytearray()
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        self._inflate = (
            zlib.decompressobj(zlib.MAX_WBITS | 32) if encoding in ("gzip", "deflate") else None
        )
        self._over = encoding not in ("identity", "", "gzip", "deflate")  # kept, or given up

    def feed(self, chunk: bytes) -> None:
        if self._over:
            return
        try:
            self._take(self._inflate.decompress(chunk) if self._inflate is not None else chunk)
        except Exception:  # keeping a turn must never break the call
            self._give_up()

    def finish(self) -> None:
        """The whole body has passed."""
        if self._over:
            return
        try:
            if self._inflate is not None:
                self._take(self._inflate.flush())
            if self._events is None:
                self._builder.add(json.loads(bytes(self._body)))
            else:
                for event in self._events.close():
                    self._event(event)
        except Exception:
            self._give_up()
            return
        self._keep()

    def drop(self) -> None:
        """The read failed: let go of the body read so far, no turn kept."""
        self._body = bytearray()
        self._over = True

    def closed(self) -> None:
        """The caller closed the body, read to its end or not."""
        if self._builder.finish_reason is not None:
            self._keep()

    def _take(self, data: bytes) -> None:
        if self._events is None:
            self._body += data
            return
        for event in self._events.feed(data):
            self._event(event)

    def _event(self, event: str) -> None:
        if self._over:
            return
        if event.strip() == _DONE:
            self._keep()
            return
        try:
            chunk = json.loads(event)
        except ValueError:
            return  # not a chunk: nothing of the turn in it
        self._builder.add(chunk)

    def _keep(self) -> None:
        if not self._over and self._builder.seen:
            self._capture.keep(self._builder)
        self._over = True

    def _give_up(self) -> None:
        self._over = True
        logger.warning("could not read a TrainGate answer's token ids", exc_info=True)


class _TappedStream(httpx.AsyncByteStream):
    """The answer's bytes, passed on as they arrive and read on the way."""

    def __init__(self, inner: httpx.AsyncByteStream, reader: _AnswerReader) -> None:
        self._inner = inner
        self._reader = reader

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                self._reader.feed(chunk)
                yield chunk
        except BaseException:
            self._reader.drop()  # what it kept must not outlive the failed read
            raise
        self._reader.finish()

    async def aclose(self) -> None:
        self._reader.closed()
        await self._inner.aclose()


@dataclass
class TurnCapture:
    """One chat call being recorded: who it is for, and since when."""

    recorder: TurnRecorder
    sample_id: str | None
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def prepare(cls, request: httpx.Request) -> tuple[httpx.Request, TurnCapture | None]:
        """A chat call made while recording: the request to send instead (asking for token
        ids and logprobs), and its capture. Other requests pass unchanged, with none."""
        recorder = _recorder.get()
        if recorder is None or not _is_chat(request):
            return request, None
        sample = request.headers.get(SAMPLE_HEADER)
        return _asking(request), cls(recorder, None if sample is None else decode_header_id(sample))

    def attach(self, response: httpx.Response) -> httpx.Response:
        """Read a successful answer as its caller reads it; kept once read to the end."""
        if response.status_code == 200 and isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _TappedStream(response.stream, _AnswerReader(self, response))
        return response

    def keep(self, builder: TurnBuilder) -> None:
        turn = builder.turn((time.perf_counter() - self.started) * 1000)
        turn["sample_id"] = self.sample_id
        self.recorder.turns.append(turn)


__all__ = [
    "ASKED_FIELDS",
    "ROLLOUT_HEADER",
    "SAMPLE_HEADER",
    "Turn",
    "TurnBuilder",
    "TurnCapture",
    "TurnRecorder",
    "make_turn",
    "recording_turns",
]
