"""The TrainGate client used by v1 rollouts (SDK.md §1.7, PROTOCOL.md §1.5-1.6).

One client serves one rollout: it posts chat completions for that rollout id, keeps the
rollout's LLM metrics, and finally posts the completion callback. Pass ``http_client`` to
share one connection pool across many rollouts (the fleet workers do); otherwise the
client opens and closes its own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
import weakref
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from rollout_sdk.client.capped import AnswerRefused, CappedTransport
from rollout_sdk.client.destinations import RefusedDestination, checked_transport
from rollout_sdk.client.turns import Turn, TurnCapture, make_turn
from rollout_sdk.config import RolloutSettings, get_settings
from rollout_sdk.core.exceptions import (
    OsmosisRolloutError,
    OsmosisServerError,
    OsmosisTimeoutError,
    OsmosisTransportError,
    OsmosisValidationError,
    RefusedDestinationError,
)
from rollout_sdk.core.foreign import answered, describe
from rollout_sdk.core.schemas import (
    CompletionsRequest,
    CompletionsResponse,
    MessageDict,
    RolloutMetrics,
    RolloutResponse,
    RolloutStatus,
)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 10.0
# An answer larger than this is parsed in a thread: parsing it would hold the event loop (and
# every rollout on it) for milliseconds.
PARSE_IN_THREAD_BYTES = 256 * 1024


@dataclass(frozen=True)
class CompletionsResult:
    """One assistant turn returned by the TrainGate."""

    message: MessageDict
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.message.get("tool_calls"))

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        # [decision] [] also when the key is present but null (the reference returns None).
        return list(self.message.get("tool_calls") or [])

    @property
    def content(self) -> Any:
        return self.message.get("content")


def _unusable(exc: ValidationError | IndexError) -> str:
    """Why a 200 answer is not a chat completion, without the values it carried."""
    if isinstance(exc, IndexError):
        return "no choices"
    problems = exc.errors(include_url=False, include_input=False, include_context=False)
    shown = [f"{'.'.join(map(str, p['loc'])) or 'body'}: {p['msg']}" for p in problems[:3]]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(shown) + more


# What is read of an answer whose status alone counts (a completion callback's) before its
# connection is dropped instead of kept for the next request.
DRAIN_BYTES = 64 * 1024


async def _drain(response: httpx.Response) -> None:
    """Read and drop an unneeded body: a small one to its end, so its connection is reused
    (a body that breaks or stalls fails the attempt, as before it was read whole); past
    :data:`DRAIN_BYTES` the rest is not read and the connection is closed."""
    if response.is_stream_consumed:  # read already (a test client's answer)
        return
    try:
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read > DRAIN_BYTES:
                break
    except AnswerRefused:
        pass  # its status is what counts; the rest is not read
    finally:
        await response.aclose()


# A large answer is parsed in a thread, one at a time per event loop: what a parse holds can
# be twenty times the answer's bytes (a list of small objects) until its checks drop it. The
# waiting is done on the loop, so waiting parses hold no thread of the loop's executor.
_large_parses: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def _parse_large(content: bytes) -> CompletionsResponse:
    lock = _large_parses.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        return await asyncio.to_thread(CompletionsResponse.model_validate_json, content)


def _oversized(parsed: CompletionsResponse, max_tokens: int, sent_bytes: int) -> str | None:
    """Why an answer's token lists cannot be what was asked (``None``: they can): more
    completion tokens than ``max_tokens``, more prompt tokens than the prompt had bytes. Each
    would be kept with the rollout's turns."""
    for name, values in (("token_ids", parsed.token_ids), ("logprobs", parsed.logprobs)):
        if values is not None and len(values) > max_tokens:
            return f"{name}: {len(values)} values, more than the max_tokens ({max_tokens}) asked"
    if parsed.prompt_token_ids is not None and len(parsed.prompt_token_ids) > sent_bytes:
        return "prompt_token_ids: more ids than the prompt sent had bytes"
    return None


def _is_200(status: int) -> bool:
    return status == 200


def _is_2xx(status: int) -> bool:
    # [decision] any 2xx acknowledges a completion callback (the reference re-posts on 202/204).
    return 200 <= status < 300


CallObserver = Callable[[httpx.Request, httpx.Response | None, BaseException | None, float], None]
"""Told of every TrainGate request an SDK client sends: the request, its response (headers
received) or the error it raised, and the seconds it took."""

_observers: list[CallObserver] = []

# Request extension naming a request's retry attempt (0: first try); observers read it.
ATTEMPT_EXTENSION = "rollout_sdk.attempt"
IDEMPOTENCY_HEADER = "Idempotency-Key"  # on completion callbacks: the rollout's idempotency key


def observe_traingate_calls(observer: CallObserver) -> None:
    """Tell ``observer`` of every request the SDK's TrainGate clients send from now on (the
    fleet's workers count them for their metrics). Observers must be quick and not raise."""
    _observers.append(observer)


class _ObservedTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request, capture = TurnCapture.prepare(request)
        if not _observers and capture is None:
            return await self._inner.handle_async_request(request)
        started = time.perf_counter()
        try:
            response = await self._inner.handle_async_request(request)
        except BaseException as exc:
            self._notify(request, None, exc, started)
            raise
        self._notify(request, response, None, started)
        return capture.attach(response) if capture is not None else response

    @staticmethod
    def _notify(
        request: httpx.Request,
        response: httpx.Response | None,
        error: BaseException | None,
        started: float,
    ) -> None:
        seconds = time.perf_counter() - started
        for observer in _observers:
            observer(request, response, error, seconds)

    async def aclose(self) -> None:
        await self._inner.aclose()


def new_http_client(
    settings: RolloutSettings | None = None, tls: ssl.SSLContext | None = None
) -> httpx.AsyncClient:
    """An ``AsyncClient`` sized by the client settings; share it across rollouts of one loop.

    Building the default TLS context (loading the CA bundle) costs about 20 ms; pass ``tls``
    to share one among many clients. Every connection is to an address the destination
    policy allows (:mod:`rollout_sdk.client.destinations`), checked as it is resolved."""
    client_settings = (settings or get_settings()).client
    limits = httpx.Limits(
        max_connections=client_settings.max_connections,
        max_keepalive_connections=client_settings.max_keepalive_connections,
    )
    tls = tls or httpx.create_ssl_context()
    transport = CappedTransport.of(
        checked_transport(client_settings.refused_networks, limits, tls), client_settings
    )
    return httpx.AsyncClient(
        transport=_ObservedTransport(transport),
        timeout=httpx.Timeout(client_settings.timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS),
    )


def _on_send(
    before_send: Callable[[], Awaitable[None]],
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore ``trace`` hook that awaits ``before_send`` as a request's headers, then its
    body, are about to be written (its connection made); what it raises aborts that request.
    The second check matters: the transport yields to the event loop after writing the
    headers, and a process frozen there would finish the request on waking."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith(("send_request_headers.started", "send_request_body.started")):
            await before_send()

    return trace


class HttpClientShards:
    """Pooled clients for many concurrent rollouts, one picked per rollout.

    httpcore's pool does O(connections × waiting requests) bookkeeping on every request and
    every release, and polls each idle connection's socket while it does (encode/httpcore#1035):
    with a thousand rollouts in flight on one pool that took 80 % of a worker's CPU, and with
    pools of 64 rollouts still two thirds of a v1 calculator rollout's cost. Pools of at most
    ``per_shard`` rollouts keep it small; a rollout's calls all go through one pool, so its
    connections are reused. The pools share one TLS context.
    """

    def __init__(
        self, concurrency: int, settings: RolloutSettings | None = None, per_shard: int = 4
    ) -> None:
        count = max(1, math.ceil(concurrency / per_shard))
        tls = httpx.create_ssl_context()
        self._clients = [new_http_client(settings, tls) for _ in range(count)]

    def for_rollout(self, rollout_id: str) -> httpx.AsyncClient:
        return self._clients[zlib.crc32(rollout_id.encode()) % len(self._clients)]

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


class OsmosisLLMClient:
    """Posts one rollout's chat completions and its completion callback to the TrainGate."""

    def __init__(
        self,
        server_url: str,
        rollout_id: str,
        api_key: str | None = None,
        timeout_seconds: float | None = None,
        max_retries: int | None = None,
        complete_rollout_retries: int | None = None,
        settings: RolloutSettings | None = None,
        *,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._settings = settings or get_settings()
        client_settings = self._settings.client
        self.server_url = server_url.rstrip("/")
        self.rollout_id = rollout_id
        self._api_key = api_key
        self.timeout_seconds = (
            client_settings.timeout_seconds if timeout_seconds is None else timeout_seconds
        )
        self.max_retries = client_settings.max_retries if max_retries is None else max_retries
        self.complete_rollout_retries = (
            client_settings.complete_rollout_retries
            if complete_rollout_retries is None
            else complete_rollout_retries
        )
        self._retry_base_delay = client_settings.retry_base_delay
        self._retry_max_delay = client_settings.retry_max_delay
        self._http = http_client
        self._owns_http = http_client is None
        self._metrics = RolloutMetrics()
        self._turns: list[Turn] = []

    async def __aenter__(self) -> OsmosisLLMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    @property
    def api_key(self) -> str | None:
        """The key sent to the TrainGate (``None`` without one), as upstream exposes it."""
        return self._api_key

    def get_metrics(self) -> RolloutMetrics:
        return self._metrics.model_copy()

    def turns(self) -> list[Turn]:
        """What each answered chat call returned besides its message: token ids and logprobs
        (when the TrainGate sent them), prompt token ids, usage, finish reason, latency; for
        trajectories."""
        return list(self._turns)

    async def chat_completions(
        self,
        messages: list[MessageDict],
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 512,
        stop: Any = None,
        logprobs: bool = True,
        **kwargs: Any,
    ) -> CompletionsResult:
        """Ask the policy for the next turn. Keywords other than the spec's are dropped."""
        request = CompletionsRequest(
            model=kwargs.get("model") or "default",
            messages=messages,
            rollout_id=self.rollout_id,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            stop=stop,
            logprobs=logprobs,
        )
        started = time.monotonic()
        sent = request.model_dump_json(exclude_none=True)
        response = await self._post(
            "/v1/chat/completions", sent, retries=self.max_retries, is_success=_is_200
        )
        try:
            if len(response.content) > PARSE_IN_THREAD_BYTES:
                parsed = await _parse_large(response.content)
            else:
                parsed = CompletionsResponse.model_validate_json(response.content)
            choice = parsed.choices[0]
            problem = _oversized(parsed, max_tokens, len(sent))
        except (ValidationError, IndexError) as exc:
            problem = _unusable(exc)
        if problem is not None:
            raise OsmosisValidationError(
                f"TrainGate returned an unusable chat completion: {problem}",
                response.status_code,
            ) from None
        usage = parsed.usage or {}
        latency_ms = (time.monotonic() - started) * 1000
        finish_reason = choice.finish_reason or "stop"
        self._turns.append(
            make_turn(
                token_ids=parsed.token_ids or [],
                logprobs=parsed.logprobs or [],
                prompt_token_ids=parsed.prompt_token_ids or [],
                usage=usage,
                finish_reason=finish_reason,
                latency_ms=latency_ms,
            )
        )
        metrics = self._metrics
        metrics.llm_latency_ms += latency_ms
        metrics.num_llm_calls += 1
        metrics.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        metrics.response_tokens += int(usage.get("completion_tokens") or 0)
        return CompletionsResult(
            message=choice.message,
            token_ids=parsed.token_ids or [],
            logprobs=parsed.logprobs or [],
            usage=usage,
            finish_reason=finish_reason,
        )

    async def complete_rollout(
        self,
        status: RolloutStatus | str,
        final_messages: list[MessageDict],
        finish_reason: str | None = "stop",
        error_message: str | None = None,
        metrics: RolloutMetrics | None = None,
        reward: float | None = None,
    ) -> None:
        """Post the completion callback (metrics default to this client's counters)."""
        await self.post_completion(
            RolloutResponse(
                rollout_id=self.rollout_id,
                status=RolloutStatus(status),
                final_messages=final_messages,
                finish_reason=finish_reason,
                error_message=error_message,
                reward=reward,
                metrics=metrics or self.get_metrics(),
            )
        )

    async def post_completion(
        self,
        response: RolloutResponse,
        *,
        idempotency_key: str | None = None,
        before_send: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Deliver a finished rollout to ``{server_url}/v1/rollout/completed``.

        ``idempotency_key`` goes out as the ``Idempotency-Key`` header, the same on every
        attempt and every repeat, so a receiver can drop a callback it already has.
        ``before_send`` is awaited before each attempt's headers are written (its
        connection open) and again before its body; what it raises stops the delivery there
        (the receiver gets no complete request) and propagates, so a caller can make sure it
        still may post (the fleet checks its lease).
        """
        extra = {IDEMPOTENCY_HEADER: idempotency_key} if idempotency_key else {}
        await self._post(
            "/v1/rollout/completed",
            response.wire_json(),
            retries=self.complete_rollout_retries,
            is_success=_is_2xx,
            headers=extra,
            before_send=before_send,
            read_answer=False,
        )

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **(extra or {})}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = new_http_client(self._settings)
        return self._http

    def _retry_delay(self, attempt: int) -> float:
        return min(self._retry_base_delay * math.pow(2, attempt), self._retry_max_delay)

    async def _post(
        self,
        path: str,
        body: str,
        *,
        retries: int,
        is_success: Callable[[int], bool],
        headers: dict[str, str] | None = None,
        before_send: Callable[[], Awaitable[None]] | None = None,
        read_answer: bool = True,
    ) -> httpx.Response:
        """POST with the spec's retry policy: retry 5xx, timeouts and transport errors. Without
        ``read_answer`` only the status counts: the body is drained, at most 64 KiB of it."""
        url = self.server_url + path
        timeout = httpx.Timeout(self.timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS)
        extensions: dict[str, Any] = {}
        if before_send is not None:
            extensions["trace"] = _on_send(before_send)
        last_error: OsmosisRolloutError | None = None
        for attempt in range(retries + 1):
            if attempt:
                await asyncio.sleep(self._retry_delay(attempt - 1))
            try:
                # httpx's timeouts bound each read and write; a receiver that drips its answer
                # a byte at a time would hold the attempt for ever. The attempt as a whole
                # gets the connect time plus the timeout.
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS + self.timeout_seconds):
                    request = self._client().build_request(
                        "POST",
                        url,
                        content=body,
                        headers=self._headers(headers),
                        timeout=timeout,
                        extensions={**extensions, ATTEMPT_EXTENSION: attempt},
                    )
                    response = await self._send(request, read_answer)
            except (httpx.TimeoutException, TimeoutError) as exc:
                last_error = OsmosisTimeoutError(f"POST {url} timed out ({type(exc).__name__})")
            except AnswerRefused as exc:  # the SDK's own words: an answer over its cap
                if not exc.retryable:
                    raise OsmosisValidationError(str(exc), exc.status_code) from None
                last_error = OsmosisTransportError(str(exc))
            except httpx.TransportError as exc:
                if isinstance(exc.__cause__, RefusedDestination):  # it will not change
                    raise RefusedDestinationError(str(exc)) from None
                # What the transport says may quote the server's bytes: never kept.
                last_error = OsmosisTransportError(describe(exc))
            else:
                if is_success(response.status_code):
                    return response
                if response.status_code < 500:
                    raise OsmosisValidationError(answered(response), response.status_code)
                last_error = OsmosisServerError(answered(response), response.status_code)
            logger.warning(
                "rollout %s: attempt %d/%d failed: %s",
                self.rollout_id,
                attempt + 1,
                retries + 1,
                last_error,
            )
        assert last_error is not None
        raise last_error

    async def _send(self, request: httpx.Request, read_answer: bool) -> httpx.Response:
        """The answer to ``request``: read whole (under the cap), or, when only its status
        counts, drained; then an answer refused for its size still tells its status."""
        if read_answer:
            return await self._client().send(request)
        try:
            response = await self._client().send(request, stream=True)
        except AnswerRefused as exc:  # its length, declared over the cap: the status came
            return httpx.Response(exc.status_code, request=request)
        await _drain(response)
        return response


__all__ = [
    "ATTEMPT_EXTENSION",
    "IDEMPOTENCY_HEADER",
    "CallObserver",
    "CompletionsResult",
    "HttpClientShards",
    "OsmosisLLMClient",
    "answered",
    "new_http_client",
    "observe_traingate_calls",
]
