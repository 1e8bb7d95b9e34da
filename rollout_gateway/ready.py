"""``GET /ready``: may this gateway take traffic? (Its agent loaded and Redis answers.)

Orchestrators poll it (compose's healthcheck runs ``rollout-fleet probe gateway``). It does
not wait for workers: admitted rollouts queue in Redis until a worker takes them, so it
reports the live workers and their slots instead of failing without them.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.exceptions import RedisError

from rollout_gateway.state import AuthorizationHeader, GatewayDep
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.server.http import INVALID_KEY_DETAIL, require_v1_key

READY_PATH = "/ready"
REDIS_CHECK_SECONDS = 3.0

router = APIRouter(tags=["operations"])


class Readiness(BaseModel):
    ready: bool
    agent: str
    protocol: Literal["v1", "v2"]
    redis: str
    """``ok``, or why Redis did not answer."""
    workers: int = 0
    """Worker processes whose heartbeat is current."""
    capacity: int = 0
    """Rollouts those workers can run at once."""


@router.get(
    READY_PATH,
    response_model=Readiness,
    responses={
        401: {"description": INVALID_KEY_DETAIL},
        503: {"model": Readiness, "description": "Redis does not answer"},
    },
)
async def ready(gateway: GatewayDep, authorization: AuthorizationHeader = None) -> JSONResponse:
    require_v1_key(authorization, gateway.api_key)  # v2 gateways checked it already
    readiness = Readiness(
        ready=False,
        agent=gateway.agent.name,
        protocol="v1" if isinstance(gateway.agent, RolloutAgentLoop) else "v2",
        redis="ok",
    )
    try:
        async with asyncio.timeout(REDIS_CHECK_SECONDS):
            await gateway.store.redis.ping()
            workers = await gateway.store.live_workers()
    except (RedisError, TimeoutError) as exc:
        readiness.redis = f"unavailable ({type(exc).__name__})"
        return JSONResponse(readiness.model_dump(), status_code=503)
    readiness.ready = True
    readiness.workers = len(workers)
    readiness.capacity = sum(worker["concurrency"] for worker in workers)
    return JSONResponse(readiness.model_dump())


__all__ = ["READY_PATH", "Readiness", "router"]
