"""``GET /metrics`` on the gateway: its admissions, and the fleet-wide figures an operator
watches and an autoscaler scales on (queue depth, oldest queued age, live workers and slots),
read from Redis at each scrape so every replica reports the same fleet."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollout_gateway.state import AuthorizationHeader, GatewayDep
from rollout_sdk.server.http import require_v1_key
from rollout_worker import metrics
from rollout_worker.envelope import record_of_message
from rollout_worker.records import RecordStore

METRICS_PATH = "/metrics"
ADMISSION_ROUTES = {"/v1/rollout/init": "v1", "/rollout": "v2"}
EXACT_OUTCOMES = {202, 409, 429, 503}

router = APIRouter(tags=["operations"])


@dataclass(frozen=True)
class FleetFigures:
    queue_depth: int
    oldest_queued_seconds: float
    active: int
    running: int
    workers: int
    slots: int


async def read_fleet(store: RecordStore) -> FleetFigures:
    """The queue and workers as Redis holds them now (a handful of reads)."""
    redis, keys = store.redis, store.keys
    async with redis.pipeline(transaction=False) as pipe:
        pipe.llen(store.queue)
        pipe.lindex(store.queue, -1)  # kombu takes messages from this end: the oldest
        pipe.zcard(keys.active)
        pipe.zcard(keys.leases)
        depth, oldest, active, running = await pipe.execute()
    age = 0.0
    record = record_of_message(oldest) if oldest else None
    if record is not None:
        accepted = cast(str | None, await redis.hget(record, "accepted_at"))
        if accepted is not None:
            age = max(0.0, time.time() - int(accepted) / 1000)
    workers = await store.live_workers()
    return FleetFigures(
        queue_depth=int(depth),
        oldest_queued_seconds=round(age, 3),
        active=int(active),
        running=int(running),
        workers=len(workers),
        slots=sum(int(worker["concurrency"]) for worker in workers),
    )


def fleet_registry(figures: FleetFigures) -> CollectorRegistry:
    registry = CollectorRegistry()
    for name, help_text, value in (
        (
            "rollout_fleet_queue_depth",
            "Rollouts waiting in the queue for a worker",
            figures.queue_depth,
        ),
        (
            "rollout_fleet_queue_oldest_age_seconds",
            "Since admission of the rollout a worker takes next (0: the queue is empty)",
            figures.oldest_queued_seconds,
        ),
        ("rollout_fleet_rollouts_active", "Rollouts admitted and not finished", figures.active),
        ("rollout_fleet_rollouts_running", "Rollouts a worker holds a lease on", figures.running),
        ("rollout_fleet_workers", "Worker processes whose heartbeat is current", figures.workers),
        ("rollout_fleet_worker_slots", "Rollouts the live workers can run at once", figures.slots),
    ):
        Gauge(name, help_text, registry=registry).set(value)
    return registry


@router.get(METRICS_PATH, include_in_schema=False)
async def scrape(gateway: GatewayDep, authorization: AuthorizationHeader = None) -> Response:
    """Prometheus text format; behind the server key when one is set."""
    require_v1_key(authorization, gateway.api_key)  # v2 gateways checked it already
    figures = await read_fleet(gateway.store)
    body = generate_latest(metrics.registry()) + generate_latest(fleet_registry(figures))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


class CountAdmissions:
    """Counts every answer to an admission request, whoever gives it (validation, auth, the
    body limit, the route): the outermost middleware."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        protocol = ADMISSION_ROUTES.get(scope.get("path", "")) if scope["type"] == "http" else None
        if protocol is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception that escapes every handler is answered 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            outcome = str(status) if status in EXACT_OUTCOMES else f"{status // 100}xx"
            metrics.ADMISSIONS.labels(protocol, outcome).inc()


__all__ = [
    "METRICS_PATH",
    "CountAdmissions",
    "FleetFigures",
    "fleet_registry",
    "read_fleet",
    "router",
]
