"""``GET /metrics`` on the gateway: its admissions, and the fleet-wide figures an operator
watches and an autoscaler scales on (queue depth, oldest queued age, live workers and slots),
read from Redis at each scrape so every replica reports the same fleet."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollout_core.metrics import registry
from rollout_core.store import FleetFigures
from rollout_gateway.state import GatewayDep

METRICS_PATH = "/metrics"
ADMISSION_ROUTES = {"/v1/rollout/init": "v1", "/rollout": "v2"}
EXACT_OUTCOMES = {202, 409, 429, 503}

ADMISSIONS = Counter(
    "rollout_fleet_admissions",
    "Admission requests (v1 POST /v1/rollout/init, v2 POST /rollout) by answer: 202, 409, "
    "429, 503, or 4xx/5xx for the others",
    ["protocol", "outcome"],
)

router = APIRouter(tags=["operations"])


def fleet_registry(figures: FleetFigures) -> CollectorRegistry:
    """The fleet's figures as gauges, in a registry of their own (made at each scrape)."""
    gauges = CollectorRegistry()
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
        (
            "rollout_fleet_rollouts_active",
            "Rollouts admitted and not finished",
            figures.counts.active,
        ),
        (
            "rollout_fleet_rollouts_running",
            "Rollouts a worker holds a lease on",
            figures.counts.running,
        ),
        (
            "rollout_fleet_workers",
            "Worker processes whose heartbeat is current",
            figures.workers.count,
        ),
        (
            "rollout_fleet_worker_slots",
            "Rollouts the live workers can run at once",
            figures.workers.slots,
        ),
    ):
        Gauge(name, help_text, registry=gauges).set(value)
    return gauges


@router.get(METRICS_PATH, include_in_schema=False)
async def scrape(gateway: GatewayDep) -> Response:
    """Prometheus text format: this gateway's counters and the fleet's figures."""
    figures = await gateway.store.fleet_figures()
    body = generate_latest(registry()) + generate_latest(fleet_registry(figures))
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
            ADMISSIONS.labels(protocol, outcome).inc()


__all__ = [
    "ADMISSIONS",
    "METRICS_PATH",
    "CountAdmissions",
    "fleet_registry",
    "router",
]
