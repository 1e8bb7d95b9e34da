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
from redis.exceptions import OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollout_gateway import lookup, metrics, ready, v1
from rollout_gateway.limits import ERROR_RESPONSES, BodySizeLimit
from rollout_gateway.listener import ChangeListener
from rollout_gateway.state import Gateway
from rollout_gateway.v2 import FleetRollouts
from rollout_sdk.config import get_settings
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import load_agent
from rollout_sdk.server.http import install_error_handlers, settle_heap
from rollout_sdk.server.v2_http import QUEUE_FULL, RolloutService, require_bearer, v2_router
from rollout_worker import celery_app, tracing
from rollout_worker.records import RecordStore, connect
from rollout_worker.secrets import load_secret_box
from rollout_worker.settings import FleetSettings


async def _store_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={"detail": f"rollout store unavailable ({type(exc).__name__}); retry later"},
        headers={"Retry-After": "5"},
    )


async def _store_full(request: Request, exc: Exception) -> JSONResponse:
    """Redis at ``maxmemory`` refuses writes (Redis 7 says so as OOM; Redis 6 wraps it in a
    script error): a v2 admission is told the queue is full (its client waits and retries),
    anything else that the store is. Any other error reply is a bug: a 500."""
    if not isinstance(exc, OutOfMemoryError) and "OOM command not allowed" not in str(exc):
        raise exc
    if request.method == "POST" and request.url.path == "/rollout":
        return JSONResponse({"detail": QUEUE_FULL}, status_code=429, headers={"Retry-After": "5"})
    return JSONResponse(
        status_code=503,
        content={"detail": "rollout store is full (Redis maxmemory); retry later"},
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
        settle_heap()
        try:
            yield
        finally:
            tracing.shutdown()
            if not speaks_v1:
                app.state.rollouts.shutting_down = True
            await listener.stop()
            tools_pool.shutdown(wait=False, cancel_futures=True)
            await redis.aclose()

    app = FastAPI(title=f"Rollout Fleet gateway ({agent.name})", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, limit=settings.max_request_bytes)
    app.add_exception_handler(RedisConnectionError, _store_unavailable)
    app.add_exception_handler(RedisTimeoutError, _store_unavailable)
    app.add_exception_handler(ResponseError, _store_full)
    app.include_router(ready.router, responses=ERROR_RESPONSES)
    app.include_router(metrics.router)
    app.include_router(lookup.router, responses=ERROR_RESPONSES)
    if speaks_v1:
        app.include_router(v1.router, responses=ERROR_RESPONSES)
    else:
        if settings.api_key is not None:
            require_bearer(app, settings.api_key.get_secret_value())
        app.include_router(v2_router(_rollouts), responses=ERROR_RESPONSES)
    app.add_middleware(metrics.CountAdmissions)  # outermost: counts every answer
    if settings.tracing:
        tracing.setup("rollout-gateway", app)
    return app


__all__ = ["create_app"]
