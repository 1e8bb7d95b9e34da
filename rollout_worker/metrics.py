"""Prometheus metrics of a worker process: what it runs, served on
``ROLLOUT_FLEET_METRICS_PORT`` (gateways count admissions and report the fleet-wide figures:
``rollout_gateway/metrics.py``)."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

import httpx
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from rollout_core.metrics import registry
from rollout_sdk.client import ATTEMPT_EXTENSION

# Seconds: from a no-op rollout's milliseconds to an agent's hour.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# OpenAI's client numbers its retries in this header (the v1 client uses ATTEMPT_EXTENSION).
OPENAI_RETRY_HEADER = "x-stainless-retry-count"

INFLIGHT = Gauge(
    "rollout_fleet_worker_inflight_rollouts",
    "Rollouts this worker process is running",
    multiprocess_mode="livesum",
)
QUEUE_WAIT = Histogram(
    "rollout_fleet_queue_wait_seconds",
    "From admission to a worker's first claim",
    ["protocol"],
    buckets=DURATION_BUCKETS,
)
DURATION = Histogram(
    "rollout_fleet_rollout_duration_seconds",
    "From a worker's claim to the rollout's terminal status, per execution",
    ["protocol", "status"],
    buckets=DURATION_BUCKETS,
)
FINISHED = Counter(
    "rollout_fleet_rollouts_finished",
    "Rollouts a worker took to a terminal status, by status and error category ('' for success)",
    ["protocol", "status", "error_category"],
)
SANDBOXES_RUNNING = Gauge(
    "rollout_fleet_worker_sandboxes_running",
    "Sandboxed rollouts (HarborBackend): trials this worker process runs now",
    multiprocess_mode="livesum",
)
SANDBOX_SLOTS = Gauge(
    "rollout_fleet_worker_sandbox_slots",
    "Sandboxed rollouts: trials this worker process runs at most at once",
    multiprocess_mode="livesum",
)
SANDBOXES_REMOVED = Counter(
    "rollout_fleet_sandboxes_removed",
    "Sandboxes removed because their execution no longer held the rollout (a worker killed, "
    "frozen past its lease)",
)
TRAINGATE_CALLS = Counter(
    "rollout_fleet_traingate_requests",
    "Requests to the TrainGate (kind: chat or callback) by outcome: the status class, "
    "timeout or transport_error",
    ["kind", "outcome"],
)
TRAINGATE_LATENCY = Histogram(
    "rollout_fleet_traingate_request_duration_seconds",
    "TrainGate request latency, until the response headers",
    ["kind"],
    buckets=CALL_BUCKETS,
)
TRAINGATE_RETRIES = Counter(
    "rollout_fleet_traingate_retries", "TrainGate requests that retried a failed one", ["kind"]
)
CALLBACKS = Counter(
    "rollout_fleet_callbacks",
    "v1 completion callbacks by outcome (delivered, or failed after every retry)",
    ["outcome"],
)
RUNS_ALONE = Counter(
    "rollout_fleet_runs_alone",
    "Rollouts run with no other rollout beside them on their worker: their worker crashed "
    "twice while they ran beside others, and a third crash must be theirs to count",
)
REQUEUES = Counter(
    "rollout_fleet_requeues",
    "Rollouts put back on the queue: lease_lapsed (their worker died), unstarted (taken, never "
    "started), lost_message (resent), handed_back (a stopping worker)",
    ["reason"],
)
WORKER_LEASES_LOST = Counter(
    "rollout_fleet_worker_leases_lost",
    "Executions stopped because another worker took their rollout over",
)
# Polling leases that ran out. The metric's name is public (dashboards, alerts) and predates
# the word "polling lease": it stays.
POLLING_LEASE_EXPIRIES = Counter(
    "rollout_fleet_poll_lease_expiries",
    "v2 rollouts failed as lease_expired because no trainer polled them in time",
)


def serve(port: int, address: str) -> tuple[WSGIServer, threading.Thread]:
    """``/metrics`` on ``port``, answered by a thread of its own (never the event loop)."""
    return start_http_server(port, address, registry())


def rollout_finished(protocol: str, status: str, error_category: str | None) -> None:
    FINISHED.labels(protocol, status, error_category or "").inc()


def _kind(request: httpx.Request) -> str:
    return "callback" if request.url.path.endswith("/rollout/completed") else "chat"


def _outcome(response: httpx.Response | None, error: BaseException | None) -> str:
    if response is not None:
        return f"{response.status_code // 100}xx"
    if isinstance(error, httpx.TimeoutException):
        return "timeout"
    return "transport_error"


def _retried(request: httpx.Request) -> bool:
    attempt = request.extensions.get(ATTEMPT_EXTENSION, 0)
    return bool(attempt) or request.headers.get(OPENAI_RETRY_HEADER, "0") != "0"


def observe_traingate_call(
    request: httpx.Request,
    response: httpx.Response | None,
    error: BaseException | None,
    seconds: float,
) -> None:
    """An SDK call observer (``rollout_sdk.client.observe_traingate_calls``)."""
    kind = _kind(request)
    TRAINGATE_CALLS.labels(kind, _outcome(response, error)).inc()
    TRAINGATE_LATENCY.labels(kind).observe(seconds)
    if _retried(request):
        TRAINGATE_RETRIES.labels(kind).inc()


__all__ = [
    "CALLBACKS",
    "DURATION",
    "FINISHED",
    "INFLIGHT",
    "POLLING_LEASE_EXPIRIES",
    "QUEUE_WAIT",
    "REQUEUES",
    "RUNS_ALONE",
    "TRAINGATE_CALLS",
    "TRAINGATE_LATENCY",
    "TRAINGATE_RETRIES",
    "WORKER_LEASES_LOST",
    "observe_traingate_call",
    "rollout_finished",
    "serve",
]
