"""Limits: settings at their edges, and a gateway whose get_tools threads hang or are all
busy, on real gateway and worker processes."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rollout_fleet.local import fleet_command
from rollout_fleet.processes import free_port
from rollout_fleet.redis_server import RedisServer
from tests.conftest import StartFleet
from tests.harness import SCRIPTED_V2_AGENT, new_id, script


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("RESULT_WAIT_TIMEOUT_SECONDS", "120", "polling_lease_timeout_seconds"),
        ("RESULT_RETENTION_SECONDS", "0", "RESULT_RETENTION_SECONDS: must be a finite"),
        ("RESULT_RETENTION_SECONDS", "60", "result_retention_seconds must be at least polling"),
        ("RESULT_RETENTION_SECONDS", "0.0004", "RESULT_RETENTION_SECONDS: must be a finite"),
        ("LEASE_SECONDS", "inf", "LEASE_SECONDS: must be a finite number of seconds from 0.001"),
        ("DRAIN_FENCE_SECONDS", "nan", "DRAIN_FENCE_SECONDS: must be a finite"),
        ("INFLIGHT_TTL_SECONDS", "1e30", "to 31536000 (365 days)"),
        ("MAX_ROLLOUT_SECONDS", "-inf", "MAX_ROLLOUT_SECONDS: must be 0, or a finite"),
        ("INFLIGHT_TTL_SECONDS", "2", "inflight_ttl_seconds must be above lease_seconds"),
        ("LEASE_SECONDS", "0.3", "lease_seconds must be at least 1"),
        ("ADMISSION_REPLICA_TIMEOUT_SECONDS", "5", "less than or equal to 2"),
        ("INFLIGHT_TTL_SECONDS", "16", "at least 4 x sweep_interval_seconds"),
        ("QUEUE", "unacked", "is a key Celery or the fleet keeps other data under"),
        ("QUEUE", "_kombu.binding.rollouts", "is a key Celery or the fleet keeps other data"),
        ("QUEUE", "rf:leases", "lies among the keys of the fleet with key prefix 'rf'"),
    ],
)
@pytest.mark.parametrize("command", ["gateway", "worker"])
def test_a_setting_that_breaks_the_fleet_refuses_to_start(
    redis_server: RedisServer, command: str, setting: str, value: str, says: str
) -> None:
    """Before: ``result_wait_timeout`` ≥ the polling lease answered every admission 500,
    ``result_retention`` 0 deleted every result, and a replica wait past a Redis command's
    3 s time limit turned each wait that ran out into a broken connection, retried until the
    store's budget was spent (a 503 after ≈ 10 s, not after the wait); all started without a
    word. Durations: under 1 ms passed ``gt=0`` and became 0 ms in Redis (a 0.0004 s retention
    deleted each result as it was written), and ``inf``/``nan`` were taken as a lease, a drain
    fence or a TTL. An in-flight TTL under four sweeps let waiting rollouts expire; a queue
    named like a key holding other data failed scripts halfway."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_FLEET_")}
    env |= {
        "REDIS_URL": f"redis://:planted-pw@127.0.0.1:{redis_server.port}/950",
        "AGENT": SCRIPTED_V2_AGENT,
        f"ROLLOUT_FLEET_{setting}": value,
    }
    listen = ["--host", "127.0.0.1", "--port", str(free_port())]
    argv = fleet_command(command, *(listen if command == "gateway" else []))
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 2, output
    assert says in output
    assert "Traceback" not in output
    assert "planted-pw" not in output


def test_a_v1_backlog_older_than_the_inflight_ttl_is_still_run(start_fleet: StartFleet) -> None:
    """One slot, a 10 s rollout holding it, and a 4 s in-flight TTL: the rollout waiting
    behind it outlives its first TTL (before: it expired in the queue; nobody was told)."""
    env = {"ROLLOUT_FLEET_INFLIGHT_TTL_SECONDS": "4"}
    handle = start_fleet(workers=1, concurrency=1, env=env)
    slow, waiting = new_id("slow"), new_id("backlog")
    body = handle.body(slow, metadata=script({"sleep": 10}))
    assert handle.init(body).status_code == 202
    handle.wait_status(slow, {"running"})
    assert handle.init(handle.body(waiting)).status_code == 202
    deliveries = handle.wait_delivered([slow, waiting], timeout=60)
    assert [c["status"] for c in deliveries[waiting]] == ["COMPLETED"]


def test_rollouts_admitted_while_no_worker_runs_outlive_the_inflight_ttl(
    start_fleet: StartFleet,
) -> None:
    """No worker for three in-flight TTLs (every worker down, or refusing to start): the
    gateway renews what waits, and the rollout runs once a worker comes (before: its record
    expired, the worker dropped its message as missing, no callback and no error anywhere)."""
    handle = start_fleet(workers=0, env={"ROLLOUT_FLEET_INFLIGHT_TTL_SECONDS": "4"})
    rollout_id = new_id("no-worker")
    assert handle.init(handle.body(rollout_id)).status_code == 202
    time.sleep(12)
    assert handle.record(rollout_id)["status"] == "queued"
    handle.fleet.start_worker(1)
    deliveries = handle.wait_delivered([rollout_id], timeout=60)
    assert [c["status"] for c in deliveries[rollout_id]] == ["COMPLETED"]


def test_hung_get_tools_calls_refuse_admissions_clearly_and_unready_the_gateway(
    start_fleet: StartFleet,
) -> None:
    """Two get_tools threads, both held by calls that hang 12 s: the next admission gets 503
    with the reason at once and ``/ready`` says not ready, until the calls return (before: the
    admission queued behind them and timed out as a 500, ``/ready`` said ready)."""
    env = {"ROLLOUT_FLEET_GET_TOOLS_THREADS": "2", "ROLLOUT_FLEET_GET_TOOLS_TIMEOUT_SECONDS": "1"}
    handle = start_fleet(workers=1, env=env)
    hang = {"get_tools": "hang", "hang_s": 12}
    for _ in range(2):
        response = handle.init(handle.body(new_id("hung"), metadata=hang))
        assert response.status_code == 500, response.text  # its own get_tools timed out
    refused = handle.init(handle.body(new_id("behind")))
    assert refused.status_code == 503, refused.text
    assert "get_tools() threads are held" in refused.json()["detail"]
    assert refused.headers["Retry-After"]
    ready = handle.http.get("/ready")
    assert ready.status_code == 503
    assert ready.json()["get_tools"] != "ok"
    time.sleep(12)
    assert handle.http.get("/ready").status_code == 200
    rollout_id = new_id("after")
    assert handle.init(handle.body(rollout_id)).status_code == 202
    handle.wait_delivered([rollout_id])


def test_a_burst_of_admissions_waits_for_get_tools_threads_instead_of_503(
    start_fleet: StartFleet,
) -> None:
    """A benchmark found it: every get_tools call in flight counted as holding a
    thread, so 256 v1 admissions at once on 16 threads answered 503 to 288 of them. Two
    threads, 20 admissions at once whose get_tools takes 0.3 s (well inside its timeout):
    all admitted, all delivered; ``/ready`` stays ready."""
    env = {"ROLLOUT_FLEET_GET_TOOLS_THREADS": "2", "ROLLOUT_FLEET_GET_TOOLS_TIMEOUT_SECONDS": "10"}
    handle = start_fleet(workers=1, env=env)
    slow = {"get_tools": "hang", "hang_s": 0.3}
    ids = [new_id("burst") for _ in range(20)]
    with ThreadPoolExecutor(len(ids)) as pool:
        answers = list(pool.map(lambda i: handle.init(handle.body(i, metadata=slow)), ids))
        ready = handle.http.get("/ready")
    assert [answer.status_code for answer in answers] == [202] * len(ids), [
        answer.text for answer in answers if answer.status_code != 202
    ][:2]
    assert ready.status_code == 200
    handle.wait_delivered(ids)
