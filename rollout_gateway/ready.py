"""``GET /ready``: may this gateway take traffic? (Its agent loaded, Redis answers, keeps
what it is given, and has the replicas admissions wait for.)

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

from rollout_core.durability import queue_conflict, replica_shortfall
from rollout_core.store import StoreError
from rollout_gateway.state import GatewayDep

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
    sandbox_slots: int = 0
    """Sandboxed rollouts: sandboxes those workers run at most at once (0: none runs any)."""
    sandboxes: int = 0
    """Sandboxes they run now."""
    get_tools: str = "ok"
    """v1: ``ok``, or why admissions are refused (every get_tools thread held)."""
    durability: str = "ok"
    """``ok``, or how Redis can lose admitted rollouts (checked again after a Redis restart)."""
    replicas: str = "ok"
    """``ok``, or how many replicas are connected of those admissions wait for, and the fix."""
    queue: str = "ok"
    """``ok``, or which other fleet (key prefix) uses this fleet's queue, and the fix."""


@router.get(
    READY_PATH,
    response_model=Readiness,
    responses={
        503: {
            "model": Readiness,
            "description": "Redis does not answer, can lose rollouts or lacks the replicas "
            "admissions wait for, another fleet uses its queue, or get_tools hangs",
        }
    },
)
async def ready(gateway: GatewayDep) -> JSONResponse:
    readiness = Readiness(
        ready=False,
        agent=gateway.agent.name,
        protocol="v1" if gateway.speaks_v1 else "v2",
        redis="ok",
    )
    try:
        async with asyncio.timeout(REDIS_CHECK_SECONDS):
            await gateway.store.ping()
            workers = await gateway.store.live_workers()
            data_loss = await gateway.watch.data_loss()
            shortfall = await replica_shortfall(gateway.store, gateway.settings)
            shared = await queue_conflict(gateway.store)
    except (StoreError, TimeoutError) as exc:
        readiness.redis = f"unavailable ({type(exc).__name__})"
        return JSONResponse(readiness.model_dump(), status_code=503)
    readiness.workers = workers.count
    readiness.capacity = workers.slots
    readiness.sandbox_slots = workers.sandbox_slots
    readiness.sandboxes = workers.sandboxes
    readiness.durability = data_loss or "ok"
    readiness.replicas = shortfall or "ok"
    readiness.queue = shared or "ok"
    if data_loss or shortfall or shared:
        return JSONResponse(readiness.model_dump(), status_code=503)
    if gateway.speaks_v1 and gateway.tools.exhausted:
        readiness.get_tools = gateway.tools.refusal()
        return JSONResponse(readiness.model_dump(), status_code=503)
    readiness.ready = True
    return JSONResponse(readiness.model_dump())


__all__ = ["READY_PATH", "Readiness", "router"]
