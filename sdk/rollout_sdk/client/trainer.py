"""``RolloutClient``: the trainer's side of the v2 protocol (SDK.md §2.12, PROTOCOL.md §2.15).

Admit a rollout, then a :class:`RolloutHandle` long-polls its result in the background,
renewing the lease with every poll, until the rollout is terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Generator
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from rollout_sdk.types.protocol import (
    POLLING_LEASE_HEADER,
    CancelRolloutsResponse,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutResultResponse,
)
from rollout_sdk.types.sample import RolloutStatus

_TRANSPORT_RETRY_DELAYS = (0.1, 0.5)
_GATEWAY_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_GATEWAY_STATUSES = frozenset({502, 503, 504})
_MILESTONES = (RolloutStatus.RUNNING, RolloutStatus.GRADING)
CANCEL_TIMEOUT_SEC = 5.0


class RolloutProtocolError(RuntimeError):
    """The server answered something the protocol does not allow (a ``RuntimeError``, as
    upstream's)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class RolloutAdmissionTimeoutError(TimeoutError):
    """Admission kept answering 429 (or timed out) past ``admission_timeout_sec``."""


def _retry_after(response: httpx.Response) -> float:
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return 1.0
    return min(max(seconds, 0.05), 60.0) if math.isfinite(seconds) else 1.0


def _expect_ok(response: httpx.Response, call: str) -> None:
    if response.status_code != 200:
        raise RolloutProtocolError(f"{call} answered {response.status_code}", response.status_code)


def _reached(status: RolloutStatus, milestone: RolloutStatus) -> bool:
    order = [RolloutStatus.QUEUED, RolloutStatus.RUNNING, RolloutStatus.GRADING]
    return status.terminal or (status in order and order.index(status) >= order.index(milestone))


class RolloutHandle:
    """One admitted rollout; ``await handle`` gives its final result."""

    def __init__(self, client: RolloutClient, admission: RolloutInitResponse) -> None:
        self.rollout_id = admission.rollout_id
        self.status = admission.status
        self.latest_result: RolloutResultResponse | None = None
        self._client = client
        self._admission = admission
        self._lease_deadline = time.monotonic() + admission.polling_lease_timeout_sec
        self._milestones = {m: asyncio.Event() for m in _MILESTONES}
        self._task = asyncio.create_task(self._poll_until_done())

    def __await__(self) -> Generator[Any, None, RolloutResultResponse]:
        return self.wait_for_completion().__await__()

    def done(self) -> bool:
        return self._task.done()

    def cancel(self) -> None:
        """Stop polling (the server-side rollout keeps running until its lease expires)."""
        self._task.cancel()

    async def wait_for_running(self) -> RolloutStatus:
        await self._milestones[RolloutStatus.RUNNING].wait()
        return self.status

    async def wait_for_grading(self) -> RolloutStatus:
        await self._milestones[RolloutStatus.GRADING].wait()
        return self.status

    async def wait_for_completion(self) -> RolloutResultResponse:
        return await asyncio.shield(self._task)

    def _observe(self, result: RolloutResultResponse) -> None:
        if result.rollout_id != self.rollout_id:
            raise RolloutProtocolError(
                f"result is for {result.rollout_id!r}, not {self.rollout_id!r}"
            )
        self.latest_result = result
        self.status = result.status
        for milestone, event in self._milestones.items():
            if _reached(result.status, milestone):
                event.set()

    async def _poll_until_done(self) -> RolloutResultResponse:
        while True:
            result = await self._poll_once()
            self._lease_deadline = time.monotonic() + self._admission.polling_lease_timeout_sec
            self._observe(result)
            if result.status.terminal:
                return result

    async def _poll_once(self) -> RolloutResultResponse:
        transport_delays = iter(_TRANSPORT_RETRY_DELAYS)
        gateway_delays = iter(_GATEWAY_RETRY_DELAYS)
        while True:
            try:
                response = await self._client.http.get(
                    f"{self._client.url}/rollout/{quote(self.rollout_id, safe='')}/result",
                    headers={
                        **self._client.auth_headers,
                        POLLING_LEASE_HEADER: self._admission.polling_lease_token,
                    },
                    timeout=self._admission.result_wait_timeout_sec + 10,
                )
            except httpx.TransportError:
                delay = next(transport_delays, None)
                if delay is None:
                    raise
            else:
                if response.status_code == 200:
                    try:
                        return RolloutResultResponse.model_validate_json(response.content)
                    except ValidationError as exc:
                        raise RolloutProtocolError(f"bad result body: {exc}", 200) from exc
                delay = (
                    next(gateway_delays, None)
                    if response.status_code in _GATEWAY_STATUSES
                    else None
                )
                if delay is None:
                    raise RolloutProtocolError(
                        f"GET result answered {response.status_code}: {response.text[:500]}",
                        response.status_code,
                    )
            if time.monotonic() + delay > self._lease_deadline:
                raise RolloutProtocolError("gave up polling: the lease would expire first")
            await asyncio.sleep(delay)


class RolloutClient:
    def __init__(
        self,
        *,
        url: str,
        http_client: httpx.AsyncClient | None = None,
        admission_timeout_sec: float | None = None,
        api_key: str | None = None,
    ) -> None:
        if admission_timeout_sec is not None and not math.isfinite(admission_timeout_sec):
            raise ValueError("admission_timeout_sec must be finite")
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key must be non-blank when given")
        self.url = url.rstrip("/")
        self.http = http_client or httpx.AsyncClient(follow_redirects=False)
        self._owns_http = http_client is None
        self.admission_timeout_sec = admission_timeout_sec
        self.auth_headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def run_rollout(self, *args: Any, **kwargs: Any) -> RolloutResultResponse:
        return await (await self.run_rollout_async(*args, **kwargs))

    async def run_rollout_async(
        self,
        initial_messages: list[dict[str, Any]],
        chat_completions_url: str,
        rollout_id: str,
        llm_api_key: str | None = None,
        label: str | None = None,
        metadata: dict[str, Any] | None = None,
        grade: bool = True,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        extra_fields: dict[str, Any] | None = None,
    ) -> RolloutHandle:
        request = RolloutInitRequest(
            rollout_id=rollout_id,
            initial_messages=initial_messages,
            chat_completions_url=chat_completions_url,
            llm_api_key=llm_api_key,
            label=label,
            metadata=metadata,
            grade=grade,
            agent_timeout_sec=agent_timeout_sec,
            grader_timeout_sec=grader_timeout_sec,
            extra_fields=extra_fields,
        )
        return RolloutHandle(self, await self._admit(request))

    async def _admit(self, request: RolloutInitRequest) -> RolloutInitResponse:
        give_up = (
            time.monotonic() + self.admission_timeout_sec if self.admission_timeout_sec else None
        )
        body = request.model_dump_json(exclude_none=True)
        while True:
            try:
                response = await self.http.post(
                    f"{self.url}/rollout",
                    content=body,
                    headers={**self.auth_headers, "Content-Type": "application/json"},
                )
            except httpx.TimeoutException as exc:
                raise RolloutAdmissionTimeoutError(
                    f"admitting {request.rollout_id} timed out; it may have been admitted"
                ) from exc
            if response.status_code == 202:
                try:
                    admission = RolloutInitResponse.model_validate_json(response.content)
                except ValidationError as exc:
                    raise RolloutProtocolError(f"bad admission body: {exc}", 202) from exc
                if admission.rollout_id != request.rollout_id:
                    raise RolloutProtocolError("admission answered for another rollout_id", 202)
                return admission
            if response.status_code != 429:
                raise RolloutProtocolError(
                    f"POST /rollout answered {response.status_code}: {response.text[:500]}",
                    response.status_code,
                )
            delay = _retry_after(response)
            if give_up is not None and time.monotonic() + delay > give_up:
                raise RolloutAdmissionTimeoutError(
                    f"{request.rollout_id}: the rollout queue stayed full"
                )
            await asyncio.sleep(delay)

    async def cancel_rollout(self, rollout_id: str) -> CancelRolloutsResponse:
        async with asyncio.timeout(CANCEL_TIMEOUT_SEC):
            response = await self.http.post(
                f"{self.url}/rollout/cancel", json={"ids": [rollout_id]}, headers=self.auth_headers
            )
        if response.status_code != 200:
            raise RolloutProtocolError(
                f"cancel answered {response.status_code}", response.status_code
            )
        return CancelRolloutsResponse.model_validate_json(response.content)

    async def health(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.url}/health", headers=self.auth_headers)
        if response.status_code != 200:
            raise RolloutProtocolError(
                f"health answered {response.status_code}", response.status_code
            )
        body: dict[str, Any] = response.json()
        return body

    async def wait_idle(
        self,
        *,
        timeout_sec: float = 120,
        poll_interval_sec: float = 1,
        process_id: str | None = None,
    ) -> dict[str, Any]:
        """Poll ``/health`` until no admitted rollout is unfinished."""
        async with asyncio.timeout(timeout_sec):
            while True:
                with contextlib.suppress(httpx.TransportError):
                    response = await self.http.get(f"{self.url}/health", headers=self.auth_headers)
                    if response.status_code == 200:
                        health: dict[str, Any] = response.json()
                        lifecycle = health.get("lifecycle")
                        if not health.get("process_id") or not isinstance(lifecycle, dict):
                            raise RolloutProtocolError("health lacks process_id or lifecycle")
                        if process_id is not None and health["process_id"] != process_id:
                            raise RolloutProtocolError("Server restarted while waiting")
                        process_id = health["process_id"]
                        if lifecycle.get("active_rollouts") == 0:
                            return health
                    elif response.status_code not in (408, 429) and response.status_code < 500:
                        raise RolloutProtocolError(
                            f"health answered {response.status_code}", response.status_code
                        )
                await asyncio.sleep(poll_interval_sec)


__all__ = [
    "RolloutAdmissionTimeoutError",
    "RolloutClient",
    "RolloutHandle",
    "RolloutProtocolError",
]
