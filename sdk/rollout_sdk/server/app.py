"""The in-process v1 rollout server: one process, rollouts as asyncio tasks (SDK.md §1.12).

Good for local development, and the baseline the fleet is benchmarked against. State lives
in memory, so it is one replica only; the fleet gateway serves the same routes (``v1_http``)
over Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from rollout_sdk.client import HttpClientShards, OsmosisLLMClient
from rollout_sdk.config import RolloutSettings, get_settings
from rollout_sdk.core.base import RolloutAgentLoop, RolloutContext
from rollout_sdk.core.exceptions import OsmosisRolloutError
from rollout_sdk.core.schemas import HealthResponse, RolloutRequest
from rollout_sdk.runner import ToolsError, prepare_rollout, run_agent_loop
from rollout_sdk.server.auth import V1ServerKey
from rollout_sdk.server.http import install_error_handlers, settle_heap
from rollout_sdk.server.v1_http import V1Service, v1_router

logger = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]


@dataclass
class _Rollout:
    admitted: asyncio.Future[str]  # the 202 body
    task: asyncio.Task[None] | None = None
    finished_at: float | None = None


@dataclass
class _InProcessServer(V1Service):
    agent_loop: RolloutAgentLoop
    settings: RolloutSettings
    max_concurrent: int
    record_ttl_seconds: float
    debug_dir: str | None
    rollouts: dict[str, _Rollout] = field(default_factory=dict)
    http: HttpClientShards | None = None
    semaphore: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.semaphore = asyncio.Semaphore(self.max_concurrent)

    async def admit(self, request: RolloutRequest) -> str:
        """Return the 202 body; a known key replays the leader's answer, never re-runs."""
        key = request.idempotency_token
        known = self.rollouts.get(key)
        if known is not None:
            return await asyncio.shield(known.admitted)
        rollout = _Rollout(admitted=asyncio.get_running_loop().create_future())
        self.rollouts[key] = rollout
        try:
            prepared = await asyncio.to_thread(prepare_rollout, self.agent_loop, request)
        except ToolsError as exc:
            del self.rollouts[key]  # forget the key: a retry is a new rollout
            rollout.admitted.set_exception(exc)
            rollout.admitted.exception()  # waiters re-raise it; mark it retrieved
            raise
        body = prepared.response.model_dump_json()
        rollout.admitted.set_result(body)
        rollout.task = asyncio.create_task(
            self._execute(request, prepared.tools, rollout, accepted_at=time.monotonic())
        )
        return body

    async def _execute(
        self, request: RolloutRequest, tools: list[Any], rollout: _Rollout, accepted_at: float
    ) -> None:
        async with self.semaphore:
            llm = OsmosisLLMClient(
                request.server_url,
                request.rollout_id,
                request.api_key,
                settings=self.settings,
                http_client=self.http.for_rollout(request.rollout_id) if self.http else None,
            )
            ctx = RolloutContext(
                request, tools, llm, _start_time=accepted_at, _debug_dir=self.debug_dir
            )
            response = await run_agent_loop(self.agent_loop, ctx)
            try:
                await llm.post_completion(response)
            except OsmosisRolloutError:
                logger.exception("rollout %s: completion callback failed", request.rollout_id)
        rollout.finished_at = time.monotonic()

    async def health(self) -> HealthResponse:
        finished = sum(1 for r in self.rollouts.values() if r.finished_at is not None)
        running = sum(
            1 for r in self.rollouts.values() if r.task is not None and r.finished_at is None
        )
        return HealthResponse(
            agent_loop=self.agent_loop.name, active_rollouts=running, completed_rollouts=finished
        )

    def forget_expired(self) -> None:
        horizon = time.monotonic() - self.record_ttl_seconds
        expired = [
            key
            for key, rollout in self.rollouts.items()
            if rollout.finished_at is not None and rollout.finished_at < horizon
        ]
        for key in expired:
            del self.rollouts[key]

    async def forget_expired_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.forget_expired()

    async def cancel_running(self) -> None:
        tasks = [r.task for r in self.rollouts.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def create_app(
    agent_loop: RolloutAgentLoop,
    max_concurrent: int | None = None,
    record_ttl_seconds: float | None = None,
    settings: RolloutSettings | None = None,
    credentials: Any = None,
    server_host: str | None = None,
    server_port: int | None = None,
    api_key: str | None = None,
    debug_dir: str | None = None,
    on_startup: Hook | None = None,
    on_shutdown: Hook | None = None,
) -> FastAPI:
    """Build the in-process v1 server for ``agent_loop`` (routes: PROTOCOL.md §1.3-1.4)."""
    settings = settings or get_settings()
    server = _InProcessServer(
        agent_loop=agent_loop,
        settings=settings,
        max_concurrent=max_concurrent or settings.server.max_concurrent_rollouts,
        record_ttl_seconds=record_ttl_seconds or settings.server.record_ttl_seconds,
        debug_dir=debug_dir,
    )
    if credentials is not None and server_host and server_port:
        logger.warning("platform registration is not supported here; serving without it")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.http = HttpClientShards(server.max_concurrent, settings)
        cleanup = asyncio.create_task(
            server.forget_expired_forever(settings.server.cleanup_interval_seconds)
        )
        if on_startup is not None:
            await on_startup()
        settle_heap()
        try:
            yield
        finally:
            if on_shutdown is not None:
                await on_shutdown()
            cleanup.cancel()
            await server.cancel_running()
            await server.http.aclose()

    app = FastAPI(title=f"Osmosis RolloutServer ({agent_loop.name})", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(v1_router(lambda _: server, V1ServerKey(api_key)))
    return app


__all__ = ["create_app"]
