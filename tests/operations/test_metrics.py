"""Prometheus metrics on the gateway and each worker count what happened
in an end-to-end run — admissions by outcome (202, 409, 429, 4xx), the fleet-wide queue depth
and oldest age while nothing consumes, then every rollout's queue wait, duration, outcome and
TrainGate calls on the workers that ran them (real gateway, workers, Redis, mock TrainGate,
the Strands example)."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from rollout_fleet.processes import wait_until
from tests.conftest import V2_ENV, StartFleet
from tests.harness import REPO, V2FleetUnderTest

STRANDS = str(REPO / "examples/strands_multiply/main.py")
ADMITTED, OVERFLOW = 50, 3

Samples = Counter[tuple[str, frozenset[tuple[str, str]]]]


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of a ``/metrics`` page: (name, labels) → value."""
    response = httpx.get(url, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = Counter()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] += sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum over samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)


def worker_samples(handle: V2FleetUnderTest) -> Samples:
    """Every worker's samples, summed."""
    samples: Samples = Counter()
    for url in handle.fleet.worker_metrics_urls():
        samples.update(scrape(url))
    return samples


def test_metrics_count_what_happened(start_fleet: StartFleet) -> None:
    handle = start_fleet(
        STRANDS,
        workers=0,
        gateways=1,
        concurrency=32,
        handle=V2FleetUnderTest,
        env={**V2_ENV, "ROLLOUT_FLEET_MAX_QUEUED": str(ADMITTED)},
    )
    assert isinstance(handle, V2FleetUnderTest)
    gateway_metrics = f"{handle.fleet.gateway_url}/metrics"
    try:
        first, token = handle.admitted()
        assert handle.admit(handle.body(first)).status_code == 409
        assert handle.http.post("/rollout", json={"rollout_id": "x"}).status_code == 422
        tokens = {first: token} | dict(handle.admitted() for _ in range(ADMITTED - 1))
        assert all(handle.admit(handle.body()).status_code == 429 for _ in range(OVERFLOW))

        waiting = scrape(gateway_metrics)
        admissions = "rollout_fleet_admissions_total"
        assert value(waiting, admissions, protocol="v2", outcome="202") == ADMITTED
        assert value(waiting, admissions, protocol="v2", outcome="429") == OVERFLOW
        assert value(waiting, admissions, protocol="v2", outcome="409") == 1
        assert value(waiting, admissions, protocol="v2", outcome="4xx") == 1
        assert value(waiting, "rollout_fleet_queue_depth") == ADMITTED
        assert value(waiting, "rollout_fleet_queue_oldest_age_seconds") > 0
        assert value(waiting, "rollout_fleet_workers") == 0

        for index in (1, 2):
            handle.fleet.start_worker(index)
        handle.fleet.wait_ready(60)
        with ThreadPoolExecutor(ADMITTED) as pool:
            results = list(pool.map(lambda item: handle.result(*item), tokens.items()))
        assert Counter(result["status"] for result in results) == {"success": ADMITTED}
        chat_calls = sum(len(handle.trainer.calls("chat", rollout_id)) for rollout_id in tokens)

        finished = "rollout_fleet_rollouts_finished_total"
        # a worker counts a rollout just after its result is stored, which a poll may see first
        wait_until(
            lambda: value(worker_samples(handle), finished) >= ADMITTED, 30, "every finish counted"
        )
        workers = worker_samples(handle)
        assert value(workers, finished, protocol="v2", status="success") == ADMITTED
        assert value(workers, finished) == ADMITTED
        assert value(workers, "rollout_fleet_queue_wait_seconds_count", protocol="v2") == ADMITTED
        duration = "rollout_fleet_rollout_duration_seconds_count"
        assert value(workers, duration, protocol="v2", status="success") == ADMITTED
        calls = "rollout_fleet_traingate_requests_total"
        assert value(workers, calls, kind="chat", outcome="2xx") == chat_calls == 2 * ADMITTED
        assert value(workers, calls) == chat_calls
        assert value(workers, "rollout_fleet_traingate_retries_total") == 0
        assert value(workers, "rollout_fleet_worker_inflight_rollouts") == 0
        # Dashboards and alerts use this name (it predates the word "polling lease"): it stays.
        assert ("rollout_fleet_poll_lease_expiries_total", frozenset()) in workers
        deadline = time.monotonic() + 10
        while value(scrape(gateway_metrics), "rollout_fleet_queue_depth") and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        drained = scrape(gateway_metrics)
        assert value(drained, "rollout_fleet_queue_depth") == 0
        assert value(drained, "rollout_fleet_workers") == 2
        assert value(drained, admissions) == ADMITTED + OVERFLOW + 2  # nothing counted twice
    finally:
        handle.close()


def test_metrics_sit_behind_the_server_key(start_fleet: StartFleet) -> None:
    handle = start_fleet(
        STRANDS, workers=1, handle=V2FleetUnderTest, env={"ROLLOUT_FLEET_API_KEY": "k-metrics"}
    )
    try:
        url = f"{handle.fleet.gateway_url}/metrics"
        key = {"Authorization": "Bearer k-metrics"}
        assert httpx.get(url).status_code == 401
        assert value(scrape(url, key), "rollout_fleet_workers") == 1
        unsigned = handle.http.post("/rollout", json=handle.body(), headers={"Authorization": ""})
        assert unsigned.status_code == 401
        after = scrape(url, key)
        assert value(after, "rollout_fleet_admissions_total", outcome="4xx") == 1  # the 401
    finally:
        handle.close()
