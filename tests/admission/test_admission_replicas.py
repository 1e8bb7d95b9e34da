"""``ROLLOUT_FLEET_ADMISSION_REPLICAS`` against real primary and replica redis-servers, a real
gateway and worker. Before: a gateway waiting for more replicas than were connected (too
high a setting, or a replica outage) started and answered ``/ready`` 200 while every admission
answered 503; and a v1 admission answered 503 (its replicas did not confirm it in time) still
ran and called its trainer back."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.processes import free_port, wait_until
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV
from tests.harness import SCRIPTED_AGENT, FleetUnderTest, MockTrainGateClient, new_id

SETTING = "ROLLOUT_FLEET_ADMISSION_REPLICAS"


def connected_replicas(server: RedisServer) -> int:
    with redis.Redis(port=server.port) as client:
        return int(client.info("replication")["connected_slaves"])


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer(data_dir=tmp_path / "primary").start()
    replica = RedisServer(data_dir=tmp_path / "replica", replica_of=primary.port).start()
    wait_until(lambda: connected_replicas(primary) == 1, 30, "the replica to connect")
    yield primary, replica
    replica.stop()
    primary.stop()


@pytest.fixture
def fleet(
    pair: tuple[RedisServer, RedisServer], mock_trainer: MockTrainGateClient, tmp_path: Path
) -> Iterator[FleetUnderTest]:
    env = {
        **TEST_ENV,
        SETTING: "1",
        "ROLLOUT_FLEET_ADMISSION_REPLICA_TIMEOUT_SECONDS": "0.5",
    }
    local = LocalFleet(
        agent=SCRIPTED_AGENT, redis_url=pair[0].url, workers=1, env=env, log_dir=tmp_path / "logs"
    )
    handle = FleetUnderTest(local, mock_trainer)
    local.start()
    yield handle
    handle.close()


def test_admission_replicas_beyond_those_connected_refuse_the_gateway_at_start(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_FLEET_")}
    env |= {"REDIS_URL": pair[0].url, "AGENT": SCRIPTED_AGENT, SETTING: "2"}
    argv = fleet_command("gateway", "--host", "127.0.0.1", "--port", str(free_port()))
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 2, output
    assert "1 of the 2 replicas" in output
    assert f"{SETTING}=1" in output
    assert "Traceback" not in output


def test_a_replica_outage_unreadies_the_gateway_and_its_refused_admissions_never_run(
    pair: tuple[RedisServer, RedisServer], fleet: FleetUnderTest
) -> None:
    before = new_id("before")
    assert fleet.init(fleet.body(before)).status_code == 202
    fleet.wait_delivered([before])
    replica = pair[1]
    replica.stop()
    wait_until(lambda: connected_replicas(pair[0]) == 0, 30, "the replica to go")

    ready = fleet.http.get("/ready")
    assert ready.status_code == 503, ready.text
    assert "0 of the 1 replicas" in ready.json()["replicas"]
    assert f"{SETTING}=0" in ready.json()["replicas"]
    refused = new_id("outage")
    answer = fleet.init(fleet.body(refused))
    assert answer.status_code == 503, answer.text
    time.sleep(4)  # time enough for a worker to run it and call back, were it queued
    assert refused not in fleet.trainer.deliveries()
    assert fleet.record(refused) == {}

    replica.start()
    wait_until(lambda: fleet.http.get("/ready").status_code == 200, 30, "/ready again")
    assert fleet.init(fleet.body(refused)).status_code == 202  # the trainer's retry
    deliveries = fleet.wait_delivered([refused])
    assert len(deliveries[refused]) == 1


def test_a_v1_admission_its_replica_does_not_confirm_never_runs_nor_calls_back(
    pair: tuple[RedisServer, RedisServer], fleet: FleetUnderTest
) -> None:
    """The replica stays connected but acknowledges nothing (SIGSTOP): the admission waits
    its 0.5 s and answers 503; before, its record and message were already written, so a
    worker ran it and called back a trainer that had been told to retry."""
    process = pair[1].process
    assert process is not None
    refused = new_id("unconfirmed")
    process.signal(signal.SIGSTOP)
    try:
        answer = fleet.init(fleet.body(refused))
        assert answer.status_code == 503, answer.text
        time.sleep(4)
        assert refused not in fleet.trainer.deliveries()
        assert fleet.record(refused) == {}
    finally:
        process.signal(signal.SIGCONT)
    assert fleet.init(fleet.body(refused)).status_code == 202  # the trainer's retry
    deliveries = fleet.wait_delivered([refused])
    assert len(deliveries[refused]) == 1
