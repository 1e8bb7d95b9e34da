"""Admissions that wait for a replica (``ROLLOUT_FLEET_ADMISSION_REPLICAS``), against a real
primary and replica: a 202 is only ever answered for a record the replica holds, and a trainer
retrying a 503 is never shut out. Found by the nemesis's sentinel stage and its repro scripts
a v1 retry was answered 202 from a record the replica never had (a
failover then lost the acknowledged rollout), and a v2 retry got 409 for a rollout whose
admission had been refused, which then ran with nobody holding its lease token."""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from rollout_core.settings import FleetSettings
from rollout_core.store import AdmitOutcome, AdmitStart, PollOutcome, RecordField, RecordStore
from rollout_core.store.store import NotReplicated
from rollout_fleet.redis_server import RedisServer

pytestmark = pytest.mark.anyio
PROTOCOL = {RecordField.PROTOCOL: "v1", RecordField.RESPONSE: "ACCEPTED"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, RedisServer]]:
    root = tmp_path_factory.mktemp("replication")
    primary = RedisServer(data_dir=root / "primary").start()
    replica = RedisServer(data_dir=root / "replica", replica_of=primary.port).start()
    link = redis.Redis(port=replica.port, decode_responses=True)
    deadline = time.monotonic() + 30
    while link.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica never synced"
        time.sleep(0.1)
    yield primary, replica
    replica.stop()
    primary.stop()


@pytest.fixture
async def store(
    pair: tuple[RedisServer, RedisServer], tmp_path: Path
) -> AsyncIterator[RecordStore]:
    settings = FleetSettings(
        redis_url=pair[0].url,
        key_prefix=tmp_path.name[:20],
        queue=f"q-{tmp_path.name[:20]}",
        secret_key=None,
        admission_replicas=1,
        admission_replica_timeout_seconds=0.5,
    )
    store = RecordStore.connect(settings)
    yield store
    await store.aclose()


class Replica:
    """The replica, paused (SIGSTOP: it acknowledges nothing) and resumed."""

    def __init__(self, server: RedisServer) -> None:
        assert server.process is not None
        self.process = server.process
        self.client = redis.Redis(port=server.port, decode_responses=True)

    def pause(self) -> None:
        self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.signal(signal.SIGCONT)

    def status_of(self, key: str) -> str | None:
        """The record's status on the replica, once replication caught up (≤ 10 s)."""
        deadline = time.monotonic() + 10
        while (status := self.client.hget(key, RecordField.STATUS)) is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return str(status)


@pytest.fixture
def replica(pair: tuple[RedisServer, RedisServer]) -> Iterator[Replica]:
    paused = Replica(pair[1])
    yield paused
    paused.resume()


async def test_a_v1_retry_is_answered_only_once_the_replica_holds_the_record(
    store: RecordStore, replica: Replica, pair: tuple[RedisServer, RedisServer]
) -> None:
    key = store.keys.record("v1", "retried")
    assert (await store.admit_begin(key, "first", 30)).start is AdmitStart.LEAD
    replica.pause()
    with pytest.raises(NotReplicated):  # the trainer hears 503 and retries
        await store.admit_commit(key, "first", 60, "MSG", PROTOCOL)
    # The unconfirmed commit was taken back (its message never queued: it must not run and
    # call back a trainer told 503); the retry admits afresh. Before: REPLAY, a 202 for what
    # the replica lacked.
    with redis.Redis(port=pair[0].port) as primary:
        assert (primary.exists(key), primary.llen(store.queue)) == (0, 0)
    replica.resume()
    again = await store.admit_begin(key, "retry", 30)
    assert again.start is AdmitStart.LEAD
    assert await store.admit_commit(key, "retry", 60, "MSG", PROTOCOL)
    assert replica.status_of(key) == "queued"
    replay = await store.admit_begin(key, "later", 30)
    assert (replay.start, replay.response) == (AdmitStart.REPLAY, "ACCEPTED")


async def test_a_v2_retry_after_a_503_takes_the_rollout_over_and_a_duplicate_later_does_not(
    store: RecordStore, replica: Replica
) -> None:
    key = store.keys.record("v2", "retried")

    async def admit(digest: str, request: str = '{"prompt": "mine"}') -> AdmitOutcome:
        return await store.admit_v2(
            key,
            max_queued=100,
            polling_lease_seconds=60,
            ttl_seconds=60,
            message="MSG",
            lease_digest=digest,
            fields={RecordField.PROTOCOL: "v2", RecordField.REQUEST: request},
        )

    async def poll(digest: str) -> PollOutcome:
        reply = await store.poll(
            key, digest, polling_lease_seconds=60, retention_seconds=60, lease_expired_result="{}"
        )
        return reply.outcome

    replica.pause()
    with pytest.raises(NotReplicated):
        await admit("first-token")
    replica.resume()
    # Another trainer's admission of the id, for another rollout, takes nothing over: the
    # stored request is the one that runs, and its result is the first trainer's.
    assert await admit("stranger", '{"prompt": "theirs"}') is AdmitOutcome.DUPLICATE
    assert await admit("retry-token") is AdmitOutcome.QUEUED  # before: DUPLICATE (409)
    assert await poll("retry-token") is PollOutcome.STATUS
    assert await poll("first-token") is PollOutcome.FORBIDDEN
    assert await admit("someone-else") is AdmitOutcome.DUPLICATE  # confirmed: no more takeovers
    assert replica.status_of(key) == "queued"


async def test_a_v2_result_is_handed_out_only_once_the_replica_holds_it(
    store: RecordStore, replica: Replica
) -> None:
    """The nemesis's sentinel stage saw a trainer poll ``success``, then the record say
    ``cancelled`` after a failover: the final write had not reached the replica. A final
    result is now told only once the replicas hold it; until then the poll answers 503."""
    key = store.keys.record("v2", "finished")
    fields = {RecordField.PROTOCOL: "v2"}
    assert (
        await store.admit_v2(
            key,
            max_queued=100,
            polling_lease_seconds=60,
            ttl_seconds=60,
            message="MSG",
            lease_digest="token",
            fields=fields,
        )
        is AdmitOutcome.QUEUED
    )
    replica.pause()
    await store.cancel({key: '{"status": "CANCELLED"}'}, 60)  # its final write

    async def poll() -> PollOutcome:
        reply = await store.poll(
            key, "token", polling_lease_seconds=60, retention_seconds=60, lease_expired_result="{}"
        )
        return reply.outcome

    with pytest.raises(NotReplicated):  # before: FINAL, a result the replica lacked
        await poll()
    replica.resume()
    assert await poll() is PollOutcome.FINAL
    assert replica.status_of(key) == "cancelled"
