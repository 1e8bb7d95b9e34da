"""Redis that fails over: a primary, a replica and three sentinels; a fleet
(gateway, two workers, Flower) given the sentinels' URL; the primary is killed while a trainer
admits rollouts. Every process follows the new primary, and with
``ROLLOUT_FLEET_ADMISSION_REPLICAS=1`` every rollout acknowledged with a 202 is delivered."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rollout_core.settings import FleetSettings
from rollout_core.store import (
    AdmitOutcome,
    AdmitStart,
    PollOutcome,
    PollReply,
    RecordField,
    RecordKey,
    RecordStore,
)
from rollout_core.store.store import NotReplicated
from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.processes import free_port
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
    sentinels = redis_pair[2]
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
        # Admissions wait for a replica: until the old primary is back as one, they answer
        # 503 and the trainer retries (a retry is never answered from an unreplicated record).
        _fail_over(redis_pair)
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
    deadline = time.monotonic() + 10
    with redis.Redis(port=replica.port) as link:
        while not link.exists(key):
            assert time.monotonic() < deadline, "the key never reached the replica"
            time.sleep(0.01)


def _cut_off(replica: RedisServer) -> None:
    """The replica stops replicating but keeps what it has, and the sentinels still promote
    it: pointed at a port nobody listens on (as the nemesis's ``--replica-lag`` does)."""
    with redis.Redis(port=replica.port) as link:
        link.replicaof("127.0.0.1", free_port())


def _fail_over(servers: tuple[RedisServer, RedisServer, SentinelSet]) -> None:
    """``kill -9`` of the primary; once the sentinels name the replica, the old primary comes
    back as its replica, in sync (its own data replaced by a full resync)."""
    primary, replica, sentinels = servers
    primary.process.kill()  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while sentinels.primary() != replica.port:
        assert time.monotonic() < deadline, "the sentinels never failed over"
        time.sleep(0.1)
    primary.stop()
    primary.replica_of = replica.port
    primary.start()
    with redis.Redis(port=primary.port, decode_responses=True) as link:
        while link.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the old primary never synced"
            time.sleep(0.1)


def _replicated_settings(sentinels: SentinelSet, **overrides: float) -> FleetSettings:
    return FleetSettings(
        redis_url=sentinels.url(0),
        key_prefix="t",
        queue="q",
        secret_key=None,
        **{"admission_replicas": 1, **overrides},  # type: ignore[arg-type]
    )


async def _admit_v2(store: RecordStore, key: RecordKey) -> AdmitOutcome:
    return await store.admit_v2(
        key,
        max_queued=10,
        polling_lease_seconds=60,
        ttl_seconds=60,
        message="MSG",
        lease_digest="token",
        fields={RecordField.PROTOCOL: "v2"},
    )


async def _poll(store: RecordStore, key: RecordKey) -> PollReply:
    return await store.poll(
        key, "token", polling_lease_seconds=60, retention_seconds=60, lease_expired_result=""
    )


class FailsOverBeforeItConfirms(RecordStore):
    """A store whose first confirmation (the call that waits for the replicas before a trainer
    is told what a record holds) comes after a failover: the primary it read the record from
    is dead, the new primary lacks what was read. The nemesis's lagged-replica runs hit this
    moment by chance, when a confirmation's WAIT outlived its primary; here it is certain."""

    failover: Callable[[], None] | None = None

    async def _replicated(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if script == "confirm" and self.failover is not None:
            failover, self.failover = self.failover, None
            await asyncio.to_thread(failover)
        return await super()._replicated(script, keys, args)


def test_a_result_told_after_a_failover_is_one_the_new_primary_holds(
    redis_pair: tuple[RedisServer, RedisServer, SentinelSet],
) -> None:
    """Found by the nemesis's sentinel stage, replica cut off 0.8 s before each kill: a poll
    read a final result on the primary, whose replica had stopped replicating, and waited for
    the replica to confirm it; the primary died during the wait, the call was retried on the
    promoted replica and the confirmation succeeded there (the old primary was back as its
    replica) — for the new primary's record, still queued — and the trainer was told the
    result the first read had seen. The rollout then ran again and ended otherwise. Now what
    a trainer is told is read in the confirmed call itself."""

    async def poll_across_a_failover() -> PollOutcome:
        store = FailsOverBeforeItConfirms.connect(_replicated_settings(redis_pair[2]))
        try:
            key = store.keys.record("v2", "told")
            admitted = await _admit_v2(store, key)
            assert admitted is AdmitOutcome.QUEUED  # the replica holds it
            _cut_off(redis_pair[1])
            await store.cancel({key: '{"status": "CANCELLED"}'}, 60)  # the primary's alone
            store.failover = functools.partial(_fail_over, redis_pair)
            return (await _poll(store, key)).outcome
        finally:
            await store.aclose()

    assert asyncio.run(poll_across_a_failover()) is PollOutcome.STATUS  # before: FINAL


def test_a_v1_replay_after_a_failover_is_one_the_new_primary_holds(
    redis_pair: tuple[RedisServer, RedisServer, SentinelSet],
) -> None:
    """The same for a v1 retry after a 503: its replay was read on the primary, which alone
    held the committed record, and confirmed on the new primary, which had the key only being
    admitted — a 202 for a rollout the fleet no longer had. Now the retry is told to wait and
    begin again; on the new primary it finds the first admission's claim. (A commit its
    replicas do not confirm is now taken back before its 503; the primary alone still holds
    one whose gateway died before taking it back, as here: committed without the wait.)"""

    async def retry_across_a_failover() -> tuple[AdmitStart, AdmitStart]:
        store = FailsOverBeforeItConfirms.connect(_replicated_settings(redis_pair[2]))
        try:
            key = store.keys.record("v1", "replayed")
            assert (await store.admit_begin(key, "first", 60)).start is AdmitStart.LEAD
            _until_replicated(redis_pair[1], key)
            _cut_off(redis_pair[1])
            unconfirmed = RecordStore.connect(
                _replicated_settings(redis_pair[2], admission_replicas=0)
            )
            try:  # the trainer heard nothing, and retries
                fields = {RecordField.RESPONSE: "202"}
                assert await unconfirmed.admit_commit(key, "first", 60, "MSG", fields)
            finally:
                await unconfirmed.aclose()
            store.failover = functools.partial(_fail_over, redis_pair)
            retried = await store.admit_begin(key, "retry", 60)
            again = await store.admit_begin(key, "retry", 60)
            return retried.start, again.start
        finally:
            await store.aclose()

    retried, again = asyncio.run(retry_across_a_failover())
    assert retried is AdmitStart.WAIT  # before: REPLAY, the lost record's 202
    assert again is AdmitStart.WAIT  # the first admission's claim, as the new primary has it


def test_a_confirmation_whose_primary_dies_while_it_waits_ends_on_the_new_primary(
    redis_pair: tuple[RedisServer, RedisServer, SentinelSet],
) -> None:
    """A poll's confirmation waits for a replica that stopped replicating; the primary dies
    meanwhile. redis-py retries the pipeline on the new primary without loading its script
    there (Redis 7 does not replicate ``SCRIPT LOAD``; this one was loaded after the cut-off):
    the poll failed with ``NoScriptError``. Now it goes again with its script loaded, and
    ends with the new primary's answer: the status, or 503 if its replica is not yet back."""

    async def poll_while_failing_over() -> PollOutcome | str:
        settings = _replicated_settings(redis_pair[2], admission_replica_timeout_seconds=2)
        store = RecordStore.connect(settings)
        try:
            key = store.keys.record("v2", "waiting")
            admitted = await _admit_v2(store, key)
            assert admitted is AdmitOutcome.QUEUED
            _cut_off(redis_pair[1])
            await store.cancel({key: '{"status": "CANCELLED"}'}, 60)
            poll = asyncio.ensure_future(_poll(store, key))
            await asyncio.sleep(0.5)  # it read the result and waits for the replica
            await asyncio.to_thread(_fail_over, redis_pair)
            try:
                return (await poll).outcome
            except NotReplicated:
                return "503"
        finally:
            await store.aclose()

    assert asyncio.run(poll_while_failing_over()) in (PollOutcome.STATUS, "503")
