"""The gateway: a stateless FastAPI front that admits rollouts into Redis.

It serves the protocol generation of the agent it is given: v1 routes for a
``RolloutAgentLoop``, v2 (poll/lease) routes for an ``AgentWorkflow``. Any replica can answer
any call: admission, deduplication, long-polls and health all go through the records in
Redis, never through this process's memory. Run several behind one port
(``rollout-fleet gateway --workers N``) or on several hosts, and they behave as one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollout_gateway import ready, v1
from rollout_gateway.listener import ChangeListener
from rollout_gateway.state import Gateway
from rollout_gateway.v2 import FleetRollouts
from rollout_sdk.config import get_settings
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import load_agent
from rollout_sdk.server.http import install_error_handlers
from rollout_sdk.server.v2_http import RolloutService, require_bearer, v2_router
from rollout_worker import celery_app
from rollout_worker.records import RecordStore, connect
from rollout_worker.secrets import load_secret_box
from rollout_worker.settings import FleetSettings


async def _store_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={"detail": f"rollout store unavailable ({type(exc).__name__}); retry later"},
        headers={"Retry-After": "5"},
    )


def _rollouts(request: Request) -> RolloutService:
    rollouts: RolloutService = request.app.state.rollouts
    return rollouts


def create_app(settings: FleetSettings | None = None) -> FastAPI:
    """Build a gateway for the configured agent (fails fast if the agent cannot load)."""
    settings = settings or celery_app.settings
    get_settings()  # a bad OSMOSIS_ROLLOUT_* value fails here, at startup
    if not settings.agent:
        raise RuntimeError("no agent configured: set AGENT (or ROLLOUT_FLEET_AGENT) to module:attr")
    agent = load_agent(settings.agent)
    speaks_v1 = isinstance(agent, RolloutAgentLoop)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = connect(settings.redis_dsn, settings.redis_max_connections)
        store = RecordStore(redis, settings.key_prefix, settings.queue)
        tools_pool = ThreadPoolExecutor(settings.get_tools_threads, thread_name_prefix="get-tools")
        gateway = Gateway(
            settings=settings,
            celery=celery_app.app,
            agent=agent,
            store=store,
            box=await load_secret_box(redis, settings),
            tools_pool=tools_pool,
        )
        app.state.gateway = gateway
        listener = ChangeListener(redis, store.keys.changes)
        if not speaks_v1:
            listener.start()
            app.state.rollouts = FleetRollouts(gateway, listener)
        try:
            yield
        finally:
            if not speaks_v1:
                app.state.rollouts.shutting_down = True
            await listener.stop()
            tools_pool.shutdown(wait=False, cancel_futures=True)
            await redis.aclose()

    app = FastAPI(title=f"Rollout Fleet gateway ({agent.name})", lifespan=lifespan)
    install_error_handlers(app)
    app.add_exception_handler(RedisConnectionError, _store_unavailable)
    app.add_exception_handler(RedisTimeoutError, _store_unavailable)
    app.include_router(ready.router)
    if speaks_v1:
        app.include_router(v1.router)
    else:
        if settings.api_key is not None:
            require_bearer(app, settings.api_key.get_secret_value())
        app.include_router(v2_router(_rollouts))
    return app


__all__ = ["create_app"]
