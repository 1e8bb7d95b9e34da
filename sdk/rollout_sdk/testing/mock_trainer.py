"""A mock TrainGate: a real HTTP server standing in for the trainer (SDK.md §1.14).

Besides the reference routes (``/v1/chat/completions``, ``/v1/rollout/completed``) it has a
small admin API under ``/mock`` so tests in another process can script it and read what it
saw: every call with its headers and body, and each completion delivery per rollout id.

The v2 side is OpenAI-compatible: ``POST /v1/rollouts/{rollout_id}/chat/completions`` answers
JSON, or SSE chunks when the body asks for ``"stream": true`` (point a rollout's
``chat_completions_url`` at ``{mock}/v1/rollouts/{rollout_id}``). Asked for them as vLLM is
(``return_token_ids``, ``logprobs``), it returns token ids and logprobs as vLLM does, random
for each call; ``/mock/calls`` shows what each answer carried (``answer``). A call's
``x-rollout-id`` and ``x-sample-id`` headers are read as P§2.11 says (percent-decoded, a plain
value as itself): ``/mock/calls`` shows the ids they name (``x_rollout_id``, ``x_sample_id``)
besides the raw headers.

    POST /mock/faults   [{"target": "chat", "status": 503, "times": 3}, ...]
                        [{"target": "chat", "reset": true, "times": null, "probability": 0.05}]
    POST /mock/config   {"latency_s": 0.1, "responder": "calculator"}
    GET  /mock/calls    ?path=chat|completed&rollout_id=...
    GET  /mock/deliveries
    GET  /mock/completed?since=N  (rollout_id, arrival time) of each delivery from the N-th on
    POST /mock/reset
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from rollout_sdk.client.headers import ROLLOUT_HEADER, SAMPLE_HEADER, decode_header_id
from rollout_sdk.core.schemas import CompletionsRequest, MessageDict, RolloutResponse
from rollout_sdk.testing.responders import (
    RESPONDERS,
    AssistantTurn,
    Responder,
    ToolCallGenerator,
    keyword_responder,
)

if TYPE_CHECKING:
    import pytest

Target = Literal["chat", "completed"]


def fake_token_ids(text: str) -> list[int]:
    return list(range(len(text)))


def fake_prompt_token_ids(messages: list[MessageDict]) -> list[int]:
    return list(range(10 * max(1, len(messages))))


@dataclass
class RolloutCompletionTracker:
    """Collects completion callbacks in-process; ``wait`` blocks until one arrives."""

    event: threading.Event = field(default_factory=threading.Event)
    responses: list[dict[str, Any]] = field(default_factory=list)

    def record(self, response: dict[str, Any]) -> None:
        self.responses.append(response)
        self.event.set()

    def clear(self) -> None:
        self.responses.clear()
        self.event.clear()

    def wait(self, timeout: float = 5.0) -> bool:
        return self.event.wait(timeout)


class Fault(BaseModel):
    """Misbehave on the next ``times`` matching calls (``None``: forever), each with
    ``probability``.

    ``delay_s`` stalls the answer; ``status`` replaces it with an error (or a bare 2xx);
    ``reset`` cuts the connection mid-answer; ``omit`` drops optional top-level fields from an
    otherwise normal chat answer.
    """

    target: Target
    status: int | None = None
    delay_s: float = Field(0.0, ge=0)
    reset: bool = False
    omit: list[str] = Field(default_factory=list)
    times: int | None = Field(1, ge=1)
    probability: float = Field(1.0, gt=0, le=1)
    rollout_id: str | None = None


class MockConfig(BaseModel):
    latency_s: float | None = Field(None, ge=0)
    responder: str | None = None


class RecordedCall(BaseModel):
    target: Target
    path: str
    rollout_id: str | None
    headers: dict[str, str]
    body: Any
    at: float
    status: int
    answer: dict[str, Any] | None = None  # OpenAI dialect: the token ids and logprobs it sent
    x_rollout_id: str | None = None  # the ids its x-rollout-id / x-sample-id headers name
    x_sample_id: str | None = None


@dataclass
class MockTrainGate:
    """The mock's state; one instance per app (``app.state.gate``)."""

    responder: Responder
    latency_s: float = 0.0
    record_calls: bool = True
    tracker: RolloutCompletionTracker | None = None
    calls: list[RecordedCall] = field(default_factory=list)
    deliveries: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    arrivals: list[tuple[str, float]] = field(default_factory=list)  # kept if calls are not
    faults: list[Fault] = field(default_factory=list)

    def take_fault(self, target: Target, rollout_id: str | None) -> Fault | None:
        for fault in self.faults:
            if fault.target == target and fault.rollout_id in (None, rollout_id):
                if fault.probability < 1 and random.random() >= fault.probability:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times == 0:
                        self.faults.remove(fault)
                return fault
        return None

    async def receive(
        self, target: Target, rollout_id: str | None, request: Request, raw: Any
    ) -> tuple[RecordedCall, Fault | None, Response | None]:
        """Record a call and apply its fault: (call, fault, the fault's answer if it has one)."""
        call = self.arrive(target, rollout_id, request, raw)
        fault = await self.misbehave(target, rollout_id)
        if isinstance(fault, Response):
            call.status = fault.status_code
            return call, None, fault
        return call, fault, None

    async def answer(self, call: RecordedCall) -> None:
        """A chat call is about to be answered: after the configured latency, with a 200."""
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        call.status = 200

    async def misbehave(self, target: Target, rollout_id: str | None) -> Fault | Response | None:
        """Apply the next matching fault: stall, then answer with its status if it has one."""
        fault = self.take_fault(target, rollout_id)
        if fault is None:
            return None
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.reset:
            return StreamingResponse(_cut_off(), media_type="application/json")
        if fault.status is None:
            return fault
        if 200 <= fault.status < 300:
            return Response(status_code=fault.status)
        return JSONResponse(status_code=fault.status, content={"detail": "injected fault"})

    def arrive(
        self, target: Target, rollout_id: str | None, request: Request, body: Any
    ) -> RecordedCall:
        """Note a call as it arrives (its status is filled in when it is answered)."""
        named = {
            name: decode_header_id(value) if (value := request.headers.get(name)) else None
            for name in (ROLLOUT_HEADER, SAMPLE_HEADER)
        }
        call = RecordedCall(
            target=target,
            path=request.url.path,
            rollout_id=rollout_id,
            headers=dict(request.headers),
            body=body,
            at=time.time(),
            status=0,
            x_rollout_id=named[ROLLOUT_HEADER],
            x_sample_id=named[SAMPLE_HEADER],
        )
        if self.record_calls:
            self.calls.append(call)
        return call

    def deliver(self, payload: dict[str, Any]) -> None:
        self.latest[payload["rollout_id"]] = payload
        self.deliveries[payload["rollout_id"]].append(payload)
        self.arrivals.append((payload["rollout_id"], time.time()))
        if self.tracker is not None:
            self.tracker.record(payload)

    def reset(self) -> None:
        self.calls.clear()
        self.deliveries.clear()
        self.latest.clear()
        self.arrivals.clear()
        self.faults.clear()
        if self.tracker is not None:
            self.tracker.clear()


class ConnectionCut(Exception):
    """Raised mid-body: the server drops the connection and the client sees it break."""


async def _cut_off() -> AsyncIterator[bytes]:
    yield b'{"choices": ['
    raise ConnectionCut("injected connection reset")


def _completion_body(request: CompletionsRequest, responder: Responder) -> dict[str, Any]:
    turn = responder(request.messages)
    text = turn.content or ""
    token_ids = fake_token_ids(text)
    prompt_ids = fake_prompt_token_ids(request.messages)
    return {
        "id": request.rollout_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [{"index": 0, "message": turn.message(), "finish_reason": turn.finish_reason}],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(token_ids),
            "total_tokens": len(prompt_ids) + len(token_ids),
        },
        "token_ids": token_ids,
        "logprobs": [0.0] * len(token_ids),
        "prompt_token_ids": prompt_ids,
    }


@dataclass(frozen=True)
class SampledTokens:
    """The tokens behind one OpenAI-dialect answer, returned the way vLLM returns them when
    the call asks (``return_token_ids``: ``prompt_token_ids`` and ``choices[].token_ids``;
    ``logprobs``: ``choices[].logprobs.content[]``): a token per character of the content,
    as the usage counts them, with ids and logprobs drawn at random for each call, so no two
    answers look alike."""

    tokens: list[str]
    token_ids: list[int]
    logprobs: list[float]
    prompt_token_ids: list[int]

    @classmethod
    def draw(cls, messages: list[Any], turn: AssistantTurn) -> SampledTokens:
        draws = random.Random()
        tokens = list(turn.content or "")
        return cls(
            tokens=tokens,
            token_ids=[draws.randrange(1, 200_000) for _ in tokens],
            logprobs=[-round(draws.random() * 5, 6) for _ in tokens],
            prompt_token_ids=[draws.randrange(1, 200_000) for _ in fake_prompt_token_ids(messages)],
        )

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.prompt_token_ids), len(self.token_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def choice_fields(self, raw: dict[str, Any], start: int, end: int) -> dict[str, Any]:
        """What a choice (or a chunk's choice) carries of the tokens ``start:end``."""
        fields: dict[str, Any] = {}
        if raw.get("return_token_ids"):
            fields["token_ids"] = self.token_ids[start:end]
        if raw.get("logprobs"):
            entries = zip(self.tokens[start:end], self.logprobs[start:end], strict=True)
            fields["logprobs"] = {
                "content": [
                    {
                        "token": token,
                        "logprob": logprob,
                        "bytes": list(token.encode()),
                        "top_logprobs": [],
                    }
                    for token, logprob in entries
                ]
            }
        return fields

    def prompt_fields(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {"prompt_token_ids": self.prompt_token_ids} if raw.get("return_token_ids") else {}

    def sent(self, raw: dict[str, Any]) -> dict[str, Any] | None:
        """What the answer carried of them (for ``RecordedCall.answer``)."""
        fields = {
            name: value
            for name, value, asked in (
                ("token_ids", self.token_ids, "return_token_ids"),
                ("prompt_token_ids", self.prompt_token_ids, "return_token_ids"),
                ("logprobs", self.logprobs, "logprobs"),
            )
            if raw.get(asked)
        }
        return fields or None


def _openai_completion(
    rollout_id: str, raw: dict[str, Any], turn: AssistantTurn, sampled: SampledTokens
) -> dict[str, Any]:
    choice = {"index": 0, "message": turn.message(), "finish_reason": turn.finish_reason}
    return {
        "id": f"chatcmpl-{rollout_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": raw.get("model") or "mock",
        "choices": [choice | sampled.choice_fields(raw, 0, len(sampled.tokens))],
        "usage": sampled.usage(),
        **sampled.prompt_fields(raw),
    }


def _sse(chunk: dict[str, Any] | str) -> str:
    return f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n"


CHUNK_CHARS = 4  # content characters per streamed chunk


def _openai_chunks(
    rollout_id: str, raw: dict[str, Any], turn: AssistantTurn, sampled: SampledTokens
) -> list[str]:
    """The same turn as ``chat.completion.chunk`` SSE events, ending with ``[DONE]``: the role
    (and the prompt's token ids) first, then the content a few characters at a time, each
    chunk with its tokens' ids and logprobs, the tool calls, the finish reason, the usage."""
    base = {
        "id": f"chatcmpl-{rollout_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": raw.get("model") or "mock",
    }

    def chunk(
        delta: dict[str, Any],
        finish: str | None = None,
        top: dict[str, Any] | None = None,
        tokens: slice | None = None,
    ) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        if tokens is not None:
            choice |= sampled.choice_fields(raw, tokens.start, tokens.stop)
        return _sse({**base, **(top or {}), "choices": [choice]})

    content = turn.content or ""
    events = [chunk({"role": "assistant", "content": ""}, top=sampled.prompt_fields(raw))]
    for start in range(0, len(content), CHUNK_CHARS):
        piece = content[start : start + CHUNK_CHARS]
        events.append(chunk({"content": piece}, tokens=slice(start, start + len(piece))))
    events += [
        chunk({"tool_calls": [{"index": i, **call}]}) for i, call in enumerate(turn.tool_calls)
    ]
    events.append(chunk({}, turn.finish_reason))
    if (raw.get("stream_options") or {}).get("include_usage"):
        events.append(_sse({**base, "choices": [], "usage": sampled.usage()}))
    events.append(_sse("[DONE]"))
    return events


async def _json_body(request: Request) -> tuple[Any, str | None]:
    """The raw JSON body and the rollout id it names (if any)."""
    try:
        raw = await request.json()
    except ValueError as exc:
        raise HTTPException(status_code=400, detail="invalid body") from exc
    rollout_id = raw.get("rollout_id") if isinstance(raw, dict) else None
    return raw, rollout_id if isinstance(rollout_id, str) else None


def _add_trainer_routes(app: FastAPI, gate: MockTrainGate) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        raw, rollout_id = await _json_body(request)
        call, fault, answered = await gate.receive("chat", rollout_id, request, raw)
        if answered is not None:
            return answered
        try:
            body = CompletionsRequest.model_validate(raw)
        except ValidationError as exc:
            call.status = 422
            raise HTTPException(status_code=422, detail=exc.errors(include_url=False)) from exc
        await gate.answer(call)
        answer = _completion_body(body, gate.responder)
        for name in fault.omit if fault is not None else []:
            answer.pop(name, None)
            answer["choices"][0].pop(name, None)
        return answer

    @app.post("/v1/rollouts/{rollout_id}/chat/completions")
    async def openai_chat_completions(rollout_id: str, request: Request) -> Any:
        raw, _ = await _json_body(request)
        call, _, answered = await gate.receive("chat", rollout_id, request, raw)
        if answered is not None:
            return answered
        if not isinstance(raw, dict) or not isinstance(raw.get("messages"), list):
            call.status = 400
            raise HTTPException(status_code=400, detail="invalid body")
        await gate.answer(call)
        turn = gate.responder(raw["messages"])
        sampled = SampledTokens.draw(raw["messages"], turn)
        call.answer = sampled.sent(raw)
        if raw.get("stream"):
            chunks = _openai_chunks(rollout_id, raw, turn, sampled)
            return StreamingResponse(iter(chunks), media_type="text/event-stream")
        return _openai_completion(rollout_id, raw, turn, sampled)

    @app.post("/v1/rollout/completed")
    async def rollout_completed(request: Request) -> Any:
        raw, rollout_id = await _json_body(request)
        call, _, answered = await gate.receive("completed", rollout_id, request, raw)
        if answered is not None:
            return answered
        try:
            payload = RolloutResponse.model_validate(raw).model_dump(mode="json", exclude_none=True)
        except ValidationError as exc:
            call.status = 422
            raise HTTPException(status_code=422, detail=exc.errors(include_url=False)) from exc
        call.status = 200
        gate.deliver(payload)
        return {"status": "ok"}

    @app.get("/v1/rollout/completed/{rollout_id}")
    async def get_completed(rollout_id: str) -> dict[str, Any]:
        return gate.latest.get(rollout_id, {})

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy", "service": "mock-trainer"}


def _add_admin_routes(app: FastAPI, gate: MockTrainGate) -> None:
    @app.post("/mock/faults")
    async def add_faults(faults: list[Fault]) -> dict[str, int]:
        gate.faults.extend(faults)
        return {"faults": len(gate.faults)}

    @app.post("/mock/config")
    async def configure(config: MockConfig) -> dict[str, Any]:
        if config.latency_s is not None:
            gate.latency_s = config.latency_s
        if config.responder is not None:
            if config.responder not in RESPONDERS:
                raise HTTPException(422, f"unknown responder; choose from {sorted(RESPONDERS)}")
            gate.responder = RESPONDERS[config.responder]()
        return {"latency_s": gate.latency_s}

    @app.get("/mock/calls")
    async def list_calls(path: Target | None = None, rollout_id: str | None = None) -> Any:
        return [
            call.model_dump()
            for call in gate.calls
            if path in (None, call.target) and rollout_id in (None, call.rollout_id)
        ]

    @app.get("/mock/deliveries")
    async def list_deliveries() -> dict[str, list[dict[str, Any]]]:
        return dict(gate.deliveries)

    @app.get("/mock/completed")
    async def list_completed(since: int = 0) -> dict[str, Any]:
        """A cheap feed for load drivers: poll with ``since`` = the last answer's ``next``."""
        return {"next": len(gate.arrivals), "completed": gate.arrivals[since:]}

    @app.post("/mock/reset")
    async def reset() -> dict[str, str]:
        gate.reset()
        return {"status": "reset"}


def create_mock_trainer_app(
    tracker: RolloutCompletionTracker | None = None,
    tool_call_generator: ToolCallGenerator | None = None,
    *,
    responder: Responder | None = None,
    latency_s: float = 0.0,
    record_calls: bool = True,
) -> FastAPI:
    """The mock TrainGate as a FastAPI app (run it with uvicorn or a ``TestClient``)."""
    gate = MockTrainGate(
        responder=responder or keyword_responder(tool_call_generator),
        latency_s=latency_s,
        record_calls=record_calls,
        tracker=tracker,
    )
    app = FastAPI(title="Mock Trainer Server")
    app.state.gate = gate
    _add_trainer_routes(app, gate)
    _add_admin_routes(app, gate)
    return app


def patch_httpx_for_mock_trainer(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Route requests an ``httpx.AsyncClient`` sends to the two TrainGate paths to ``client``
    (a ``fastapi.testclient.TestClient`` of the mock app); other URLs pass through."""
    import httpx

    original_send = httpx.AsyncClient.send

    async def send(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> Any:
        for path in ("/v1/chat/completions", "/v1/rollout/completed"):
            if request.url.path.endswith(path):
                headers = {
                    name: value
                    for name, value in request.headers.items()
                    if name.lower() not in ("host", "content-length")
                }
                return client.request(
                    request.method, path, content=request.content, headers=headers
                )
        return await original_send(self, request, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "send", send)


__all__ = [
    "Fault",
    "MockTrainGate",
    "RolloutCompletionTracker",
    "create_mock_trainer_app",
    "fake_prompt_token_ids",
    "fake_token_ids",
    "patch_httpx_for_mock_trainer",
]
