"""Redis that fails over (issue 14, build 5): a primary, a replica and three sentinels; a fleet
(gateway, two workers, Flower) given the sentinels' URL; the primary is killed while a trainer
admits rollouts. Every process follows the new primary, and with
``ROLLOUT_FLEET_ADMISSION_REPLICAS=1`` every rollout acknowledged with a 202 is delivered."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from rollout_core.settings import FleetSettings
from rollout_core.store import AdmitStart, RecordStore
from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.redis_server import RedisServer, SentinelSet
from tests.chaos.harness import Trainer
from tests.conftest import TEST_ENV
from tests.harness import SCRIPTED_AGENT, MockTrainGateClient, new_id, script, v1_body

ROLLOUTS = 60


@pytest.fixture
def redis_pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer, SentinelSet]]:
    primary = RedisServer(data_dir=tmp_path / "primary").start()
    replica = RedisServer(data_dir=tmp_path / "replica", replica_of=primary.port).start()
    sentinels = SentinelSet(primary.port, tmp_path / "sentinels").start()
    link = redis.Redis(port=replica.port, decode_responses=True)
    deadline = time.monotonic() + 30
    while link.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica never synced"
        time.sleep(0.1)
    link.close()
    yield primary, replica, sentinels
    sentinels.stop()
    replica.stop()
    primary.stop()


def test_every_process_follows_a_failover_and_acknowledged_rollouts_survive(
    redis_pair: tuple[RedisServer, RedisServer, SentinelSet], tmp_path: Path
) -> None:
    primary, replica, sentinels = redis_pair
    env = {**TEST_ENV, "ROLLOUT_FLEET_ADMISSION_REPLICAS": "1"}
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=sentinels.url(0),
        workers=2,
        flower=True,
        mock_trainer="calculator",
        env=env,
        log_dir=tmp_path / "fleet",
    )
    fleet.start()
    try:
        trainer_gate = MockTrainGateClient(fleet.mock_trainer_url)
        bodies = [
            v1_body(fleet.mock_trainer_url, new_id("failover"), metadata=script({"sleep": 2}))
            for _ in range(ROLLOUTS)
        ]
        trainer = Trainer("v1", [fleet.gateway_url], bodies, pace=0.2).start()
        time.sleep(4)
        primary.process.kill()  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while sentinels.primary() != replica.port:
            assert time.monotonic() < deadline, "the sentinels never failed over"
            time.sleep(0.2)
        # Admissions wait for a replica: until the old primary is back as one, they answer
        # 503 and the trainer retries (a retry is never answered from an unreplicated record).
        primary.stop()
        primary.replica_of = replica.port
        primary.start()
        trainer.join(120)
        assert len(trainer.admitted) == ROLLOUTS
        deadline = time.monotonic() + 90
        while not trainer.admitted <= trainer_gate.deliveries().keys():
            missing = trainer.admitted - trainer_gate.deliveries().keys()
            assert time.monotonic() < deadline, f"{len(missing)} never delivered\n{_logs(fleet)}"
            time.sleep(0.5)
        deliveries = trainer_gate.deliveries()
        assert {c["status"] for i in trainer.admitted for c in deliveries[i]} == {"COMPLETED"}
        listing = subprocess.run(
            fleet_command("ls"),
            env=fleet.process_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listing.returncode == 0, listing.stderr
        assert fleet.readiness().ready
        user, password = fleet.flower_auth.split(":")
        workers = httpx.get(f"{fleet.flower_url}/api/workers", auth=(user, password), timeout=30)
        assert workers.status_code == 200, workers.text
    finally:
        fleet.stop()


def _logs(fleet: LocalFleet) -> str:
    return "\n".join(f"--- {n} ---\n{p.output()[-3000:]}" for n, p in fleet.processes.items())


def test_a_store_call_across_a_failover_reaches_the_new_primary(
    redis_pair: tuple[RedisServer, RedisServer, SentinelSet],
) -> None:
    """Found by the nemesis's sentinel stage: a call whose connection broke with the primary
    reconnected to the dead primary's address on every retry (redis-py's command path does
    not ask the sentinels again) and failed when its budget ran out, ≈ 10 s, although the
    sentinels had named the new primary within ≈ 3 s. Now it reaches the new primary."""
    primary, replica, sentinels = redis_pair
    settings = FleetSettings(redis_url=sentinels.url(0), key_prefix="t", queue="q", secret_key=None)

    async def across_a_failover() -> tuple[int, bool]:
        store = RecordStore.connect(settings)
        try:
            key = store.keys.record("v1", "failover")
            assert (await store.admit_begin(key, "tok", 60)).start is AdmitStart.LEAD
            _until_replicated(replica, key)  # else the new primary rightly knows nothing of it
            primary.process.kill()  # type: ignore[union-attr]
            again = await store.admit_begin(key, "tok", 60)  # the call in flight
            return replica.port, again.start is AdmitStart.WAIT
        finally:
            await store.aclose()

    new_primary, found_its_record = asyncio.run(across_a_failover())
    assert sentinels.primary() == new_primary
    assert found_its_record


def _until_replicated(replica: RedisServer, key: str) -> None:
    """Replication is asynchronous: a key written just before the primary dies may never reach
    the replica (CI saw it once). The test is about where the call goes, not about that loss
    (``ROLLOUT_FLEET_ADMISSION_REPLICAS`` covers it), so it waits for the copy first."""
    link = redis.Redis(port=replica.port)
    try:
        deadline = time.monotonic() + 10
        while not link.exists(key):
            assert time.monotonic() < deadline, "the key never reached the replica"
            time.sleep(0.01)
    finally:
        link.close()
