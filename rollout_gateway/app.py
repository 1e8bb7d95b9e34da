"""The gateway: a stateless FastAPI front that admits rollouts into Redis.

Any replica can answer any call: admission, deduplication and health all go through the
records in Redis, never through this process's memory. Run several behind one port
(``rollout-fleet gateway --workers N``) and they behave as one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollout_gateway import v1
from rollout_gateway.state import Gateway
from rollout_sdk.config import get_settings
from rollout_sdk.loader import load_agent_loop
from rollout_worker import celery_app
from rollout_worker.records import RecordStore
from rollout_worker.secrets import load_secret_box
from rollout_worker.settings import FleetSettings


async def _store_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={"detail": f"rollout store unavailable ({type(exc).__name__}); retry later"},
        headers={"Retry-After": "5"},
    )


def create_app(settings: FleetSettings | None = None) -> FastAPI:
    """Build a gateway for the configured agent (fails fast if the agent cannot load)."""
    settings = settings or celery_app.settings
    get_settings()  # a bad OSMOSIS_ROLLOUT_* value fails here, at startup
    if not settings.agent:
        raise RuntimeError("no agent configured: set AGENT (or ROLLOUT_FLEET_AGENT) to module:attr")
    agent_loop = load_agent_loop(settings.agent)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = Redis.from_url(settings.redis_dsn, decode_responses=True)
        tools_pool = ThreadPoolExecutor(settings.get_tools_threads, thread_name_prefix="get-tools")
        app.state.gateway = Gateway(
            settings=settings,
            celery=celery_app.app,
            agent_loop=agent_loop,
            store=RecordStore(redis, settings.key_prefix, settings.queue),
            box=await load_secret_box(redis, settings),
            tools_pool=tools_pool,
        )
        try:
            yield
        finally:
            tools_pool.shutdown(wait=False, cancel_futures=True)
            await redis.aclose()

    app = FastAPI(title=f"Rollout Fleet gateway ({agent_loop.name})", lifespan=lifespan)
    app.add_exception_handler(RedisConnectionError, _store_unavailable)
    app.add_exception_handler(RedisTimeoutError, _store_unavailable)
    app.include_router(v1.router)
    return app


__all__ = ["create_app"]
