"""The in-process v1 rollout server: one process, rollouts as asyncio tasks (SDK.md §1.12).

Good for local development, and the baseline the fleet is benchmarked against. State lives
in memory, so it is one replica only; the fleet gateway serves the same routes (``v1_http``)
over Redis.

Upstream 0.3 has its v2 server factory at this module path (``osmosis_ai.rollout.server.app``),
so :func:`create_rollout_server` and its defaults resolve here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
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
from rollout_sdk.server.rollout_server import create_rollout_server
from rollout_sdk.server.state import AppState
from rollout_sdk.server.v1_http import V1Service, v1_router
from rollout_sdk.types.protocol import (
    DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    DEFAULT_RESULT_RETENTION_SEC,
    DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    POLLING_LEASE_HEADER,
)

logger = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]


@dataclass
class _InProcessServer(V1Service):
    """The v1 routes' service over an :class:`AppState`."""

    agent_loop: RolloutAgentLoop
    settings: RolloutSettings
    state: AppState
    debug_dir: str | None
    http: HttpClientShards | None = None

    async def admit(self, request: RolloutRequest) -> str:
        """Return the 202 body; a known key replays the leader's answer, never re-runs."""
        key = request.idempotency_token
        admitted, leader = self.state.get_or_create_init_future(key)
        if not leader:
            return (await asyncio.shield(admitted)).model_dump_json()
        try:
            prepared = await asyncio.to_thread(prepare_rollout, self.agent_loop, request)
        except ToolsError as exc:
            self.state.clear_init_record(key)  # a retry is a new rollout
            admitted.set_exception(exc)
            admitted.exception()  # waiters re-raise it; mark it retrieved
            raise
        admitted.set_result(prepared.response)
        task = asyncio.create_task(
            self._execute(key, request, prepared.tools, accepted_at=time.monotonic())
        )
        self.state.mark_started(key, task)
        return prepared.response.model_dump_json()

    async def _execute(
        self, key: str, request: RolloutRequest, tools: list[Any], accepted_at: float
    ) -> None:
        try:
            async with self.state.semaphore:
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
        finally:
            self.state.mark_completed(key)

    async def health(self) -> HealthResponse:
        return HealthResponse(
            agent_loop=self.agent_loop.name,
            active_rollouts=self.state.active_count,
            completed_rollouts=self.state.completed_count,
        )


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
    state = AppState(
        max_concurrent=max_concurrent,
        record_ttl_seconds=record_ttl_seconds,
        settings=settings.server,
        agent_loop_name=agent_loop.name,
    )
    server = _InProcessServer(agent_loop, settings, state, debug_dir)
    if credentials is not None and server_host and server_port:
        logger.warning("platform registration is not supported here; serving without it")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.http = HttpClientShards(state.max_concurrent, settings)
        state.start_cleanup_task()
        if on_startup is not None:
            await on_startup()
        settle_heap()
        try:
            yield
        finally:
            if on_shutdown is not None:
                await on_shutdown()
            await state.stop_cleanup_task()
            await state.cancel_all()
            await server.http.aclose()

    app = FastAPI(title=f"Osmosis RolloutServer ({agent_loop.name})", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(v1_router(lambda _: server, V1ServerKey(api_key)))
    return app


__all__ = [
    "DEFAULT_POLLING_LEASE_TIMEOUT_SEC",
    "DEFAULT_RESULT_RETENTION_SEC",
    "DEFAULT_RESULT_WAIT_TIMEOUT_SEC",
    "POLLING_LEASE_HEADER",
    "create_app",
    "create_rollout_server",
]
