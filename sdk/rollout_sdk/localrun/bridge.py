"""A local TrainGate for ``rollout-sdk test``: agents call it as they call a trainer, and it
forwards each call to a real OpenAI-compatible endpoint with the chosen model and key.

v1 agents post the TrainGate's dialect to ``{bridge}/v1/chat/completions`` (their rollout's
tools are added to every call, as a trainer would); v2 agents post OpenAI's own dialect to
``{bridge}/v1/rollouts/<rollout id>/chat/completions``, streamed or not. The bridge keeps each
rollout's token usage, upstream failures and (when asked) a trace of its calls, and lets a
:class:`Stepper` pause before every call (the interactive mode). For v1 rollouts run by a fleet
(an evaluation) it also takes their completion callbacks, as a trainer would.

Given a ``key`` (an evaluation always gives one: a random key of its own), every call must
carry it as ``Authorization: Bearer <key>``, as a TrainGate's rollout key: the rollouts of the
run get it as their API key, and whoever else reaches the bridge's port cannot spend the model
endpoint's credentials through it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollout_sdk.core.schemas import MessageDict, RolloutResponse

# Upstream answers that no retry fixes: the batch stops rather than fail every row the same way.
FATAL_STATUSES = {401: "authentication failed", 403: "access denied", 429: "quota or rate limit"}
UPSTREAM_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
# The TrainGate dialect's fields that mean nothing to an OpenAI-compatible endpoint (v1), and
# what fleet workers ask a TrainGate for to keep token ids (v2), which such an endpoint may
# refuse: the bridge drops them.
V1_ONLY_FIELDS = ("rollout_id", "logprobs")
TOKEN_ID_FIELDS = ("return_token_ids", "logprobs")


def _os_cause(exc: BaseException) -> str | None:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "host not found"
        if isinstance(cause, OSError) and cause.strerror:
            return str(cause.strerror).lower()
        cause = cause.__cause__ or cause.__context__
    return None


# What httpx's messages say, when the OS error under them is gone.
KNOWN_FAILURES = {
    "connection refused": "connection refused",
    "name or service not known": "host not found",
    "temporary failure in name resolution": "host not found",
    "connection reset": "connection reset",
}


def http_failure(exc: BaseException) -> str:
    """Why a request got no answer, in a person's words ("connection refused"), from an
    httpx error and the OS error under it (httpx's own text is often empty)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timed out"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    text = str(exc).lower()
    known = next((said for words, said in KNOWN_FAILURES.items() if words in text), None)
    return _os_cause(exc) or known or str(exc) or type(exc).__name__


def unreachable(url: str, exc: BaseException) -> str:
    """The one line that says a model endpoint could not be reached, and why."""
    return f"the model endpoint {url} is unreachable: {http_failure(exc)}"


class Stepper(Protocol):
    """Watches (and may hold up) each LLM call of a local run."""

    async def before_call(self, rollout_id: str, body: dict[str, Any]) -> bool:
        """``False``: do not send this call (the run is being abandoned)."""
        ...

    async def after_call(self, rollout_id: str, message: MessageDict | None) -> None: ...


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def token_usage(self) -> dict[str, int]:
        """As a row result reports it."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    def add(self, usage: dict[str, Any] | None) -> None:
        usage = usage or {}
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += int(usage.get("completion_tokens") or 0)


class StreamedMessage:
    """Rebuilds the assistant message from ``chat.completion.chunk`` SSE events."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self._pending = b""

    def feed(self, data: bytes) -> None:
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            payload = line.strip().removeprefix(b"data:").strip()
            if not line.startswith(b"data:") or payload == b"[DONE]":
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            self.usage = chunk.get("usage") or self.usage
            for choice in chunk.get("choices") or []:
                self._delta(choice.get("delta") or {})

    def _delta(self, delta: dict[str, Any]) -> None:
        if delta.get("content"):
            self.content.append(delta["content"])
        for call in delta.get("tool_calls") or []:
            slot = self.tool_calls.setdefault(
                call.get("index", 0),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            slot["function"]["name"] += function.get("name") or ""
            slot["function"]["arguments"] += function.get("arguments") or ""

    def message(self) -> MessageDict:
        message: MessageDict = {"role": "assistant", "content": "".join(self.content)}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message


class LLMBridge:
    def __init__(
        self,
        upstream: str,
        model: str,
        api_key: str | None = None,
        *,
        stepper: Stepper | None = None,
        trace: bool = False,
        key: str | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.model = model
        self.key = key  # what every call must carry (None: any call is taken)
        self.stepper = stepper
        self.traces: dict[str, list[dict[str, Any]]] | None = {} if trace else None
        self.tools: dict[str, list[Any]] = {}  # v1 rollout id → tools sent with every call
        self.usage: dict[str, Usage] = {}
        self.fatal: str | None = None  # why the batch must stop (auth, quota, unreachable)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=UPSTREAM_TIMEOUT)
        self._completions: dict[str, asyncio.Future[RolloutResponse]] = {}
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1") -> str:
        """Serve on a free port of ``host`` (loopback unless a fleet elsewhere or a sandbox
        must reach it); returns the bridge's URL."""
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._keyed(self._v1_call), methods=["POST"]),
                Route("/v1/rollout/completed", self._keyed(self._v1_completed), methods=["POST"]),
                Route(
                    "/v1/rollouts/{rollout_id}/chat/completions",
                    self._keyed(self._v2_call),
                    methods=["POST"],
                ),
            ]
        )
        listener = socket.socket()
        try:
            listener.bind((host, 0))
        except OSError:
            listener.close()
            raise
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._serving = asyncio.create_task(self._server.serve(sockets=[listener]))
        while not self._server.started:
            if self._serving.done():
                await self._serving  # raises why it could not start
            await asyncio.sleep(0.01)
        self.url = f"http://{host}:{listener.getsockname()[1]}"
        return self.url

    async def stop(self, *, force: bool = False) -> None:
        """Stop serving; ``force``: now, dropping the calls under way (a stopped run does
        not wait for an LLM's answer nobody will read)."""
        if self._server is not None and self._serving is not None:
            if force:
                await _drop_calls(self._server)
            self._server.should_exit = True
            self._server.force_exit = force
            await self._serving
        await self._http.aclose()

    def usage_of(self, rollout_id: str) -> Usage:
        return self.usage.setdefault(rollout_id, Usage())

    def completion_of(self, rollout_id: str) -> asyncio.Future[RolloutResponse]:
        """The v1 completion callback of ``rollout_id``, once it is posted here."""
        return self._completions.setdefault(rollout_id, asyncio.get_running_loop().create_future())

    def forget(self, rollout_id: str) -> None:
        """Drop what the bridge kept of a finished rollout."""
        for kept in (self.usage, self.tools, self._completions):
            kept.pop(rollout_id, None)

    # --- routes ---------------------------------------------------------------------------

    def _keyed(self, route: Callable[[Request], Awaitable[Response]]) -> Callable[..., Any]:
        """``route``, for calls that carry the bridge's key (all of them without a key)."""

        async def checked(request: Request) -> Response:
            if self.key is not None and not _carries(request, self.key):
                return JSONResponse(
                    {"detail": "this bridge takes only its run's rollouts: send their API key"},
                    status_code=401,
                )
            try:
                return await route(request)
            except ClientDisconnect:  # the agent's call was cut (the run stops): nobody reads it
                return Response(status_code=499)

        return checked

    async def _v1_call(self, request: Request) -> Response:
        body = await _json(request)
        rollout_id = str(body.get("rollout_id") or "")
        openai_body = {k: v for k, v in body.items() if k not in V1_ONLY_FIELDS}
        if self.tools.get(rollout_id):
            openai_body["tools"] = self.tools[rollout_id]
        return await self._forward(rollout_id, openai_body)

    async def _v1_completed(self, request: Request) -> Response:
        try:
            response = RolloutResponse.model_validate(await _json(request))
        except ValueError as exc:
            return JSONResponse({"detail": f"not a completion: {exc}"}, status_code=400)
        waiter = self.completion_of(response.rollout_id)
        if not waiter.done():  # a repeated callback changes nothing
            waiter.set_result(response)
        return JSONResponse({"status": "ok"})

    async def _v2_call(self, request: Request) -> Response:
        body = {k: v for k, v in (await _json(request)).items() if k not in TOKEN_ID_FIELDS}
        return await self._forward(request.path_params["rollout_id"], body)

    async def _forward(self, rollout_id: str, body: dict[str, Any]) -> Response:
        body = {**body, "model": self.model}
        if self.stepper is not None and not await self.stepper.before_call(rollout_id, body):
            return JSONResponse({"detail": "abandoned at the prompt"}, status_code=503)
        self._trace(rollout_id, "llm_request", messages=body.get("messages"))
        started = time.monotonic()
        url = f"{self.upstream}/chat/completions"
        try:
            if body.get("stream"):
                return await self._stream(rollout_id, url, body, started)
            response = await self._http.post(url, json=body)
        except httpx.HTTPError as exc:
            return self._failed(rollout_id, unreachable(self.upstream, exc), 502, True)
        if response.status_code != 200:
            return self._refused(rollout_id, response.status_code, response.text)
        answer = response.json()
        message = ((answer.get("choices") or [{}])[0]).get("message")
        await self._answered(rollout_id, message, answer.get("usage"), started)
        return JSONResponse(answer)

    async def _stream(
        self, rollout_id: str, url: str, body: dict[str, Any], started: float
    ) -> Response:
        upstream = await self._http.send(
            self._http.build_request("POST", url, json=body), stream=True
        )
        if upstream.status_code != 200:
            text = (await upstream.aread()).decode(errors="replace")
            await upstream.aclose()
            return self._refused(rollout_id, upstream.status_code, text)
        rebuilt = StreamedMessage()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for data in upstream.aiter_raw():
                    rebuilt.feed(data)
                    yield data
            finally:
                await upstream.aclose()
                await self._answered(rollout_id, rebuilt.message(), rebuilt.usage, started)

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def _answered(
        self, rollout_id: str, message: MessageDict | None, usage: Any, started: float
    ) -> None:
        tally = self.usage_of(rollout_id)
        tally.calls += 1
        tally.add(usage if isinstance(usage, dict) else None)
        latency_ms = round((time.monotonic() - started) * 1000, 1)
        self._trace(rollout_id, "llm_response", message=message, usage=usage, latency_ms=latency_ms)
        if self.stepper is not None:
            await self.stepper.after_call(rollout_id, message)

    def _refused(self, rollout_id: str, status: int, text: str) -> Response:
        reason = FATAL_STATUSES.get(status)
        detail = f"{self.upstream} answered {status}" + (f" ({reason})" if reason else "")
        return self._failed(rollout_id, f"{detail}: {text[:500]}", status, reason is not None)

    def _failed(self, rollout_id: str, message: str, status: int, fatal: bool) -> Response:
        self.usage_of(rollout_id).errors.append(message)
        self._trace(rollout_id, "llm_error", error=message)
        if fatal and self.fatal is None:
            self.fatal = message
        return JSONResponse({"detail": message}, status_code=status)

    def _trace(self, rollout_id: str, event: str, **fields: Any) -> None:
        if self.traces is not None:
            self.traces.setdefault(rollout_id, []).append(
                {"event": event, "ts": time.time(), **fields}
            )


# How long the calls a forced stop cancels get to end.
DROP_WAIT_SECONDS = 1.0


async def _drop_calls(server: uvicorn.Server) -> None:
    """Cancel the calls under way, without uvicorn logging each as an application error (it
    would, had the loop's teardown cancelled them): they were dropped on purpose."""
    for listener in server.servers:  # no new call comes in meanwhile
        listener.close()
    calls = list(server.server_state.tasks)
    if not calls:
        return
    errors = logging.getLogger("uvicorn.error")
    was_disabled, errors.disabled = errors.disabled, True
    try:
        for call in calls:
            call.cancel()
        await asyncio.wait(calls, timeout=DROP_WAIT_SECONDS)
    finally:
        errors.disabled = was_disabled


def _carries(request: Request, key: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {}


__all__ = ["LLMBridge", "Stepper", "StreamedMessage", "Usage", "http_failure", "unreachable"]
