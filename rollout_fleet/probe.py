"""Health probes for orchestrators (compose healthchecks): exit 0 when healthy, 1 otherwise.

Slim images have no curl, and a probe must know the fleet's own notion of health: the
gateway's ``/ready`` (behind the server key for v2) and the worker's liveness file, which
the worker touches only while its intake takes work and its Celery consumer (revokes,
heartbeats), asyncio loop and Redis all answer.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from rollout_core.settings import FleetSettings
from rollout_gateway.ready import READY_PATH, Readiness


class ProbeFailed(Exception):
    """The probed process is not healthy; the message says why."""


def probe_gateway(base_url: str, api_key: str | None, timeout: float = 5.0) -> Readiness:
    """The gateway's readiness; ``api_key`` is the server key (a v2 gateway requires it)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}{READY_PATH}", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ProbeFailed(f"gateway at {base_url} unreachable: {type(exc).__name__}") from exc
    if response.status_code not in (200, 503):
        raise ProbeFailed(f"gateway at {base_url} answered {response.status_code}")
    readiness = Readiness.model_validate_json(response.content)
    if not readiness.ready:
        problems = [
            f"{name} {value}"
            for name, value in (
                ("redis", readiness.redis),
                ("durability", readiness.durability),
                ("replicas", readiness.replicas),
                ("queue", readiness.queue),
                ("get_tools", readiness.get_tools),
            )
            if value != "ok"
        ]
        raise ProbeFailed(f"gateway not ready: {'; '.join(problems) or 'unknown'}")
    return readiness


def probe_worker(settings: FleetSettings, max_age_seconds: float) -> float:
    """The age of the worker's liveness file, if younger than ``max_age_seconds``."""
    alive = Path(settings.worker_alive_file)
    try:
        age = time.time() - alive.stat().st_mtime
    except FileNotFoundError as exc:
        raise ProbeFailed(f"worker not consuming yet ({alive} missing)") from exc
    if age > max_age_seconds:
        raise ProbeFailed(f"worker stalled: {alive} last touched {age:.0f}s ago")
    return age


__all__ = ["ProbeFailed", "probe_gateway", "probe_worker"]
