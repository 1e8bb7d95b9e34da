"""The record state machine (Lua scripts) against a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from rollout_fleet.redis_server import RedisServer
from rollout_worker.records import RecordStore, Status, Verdict

LEASE_MS = 200
RETAIN_MS = 60_000


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RecordStore]:
    redis = Redis.from_url(redis_server.url_for(1001), decode_responses=True)
    await redis.flushdb()
    yield RecordStore(redis, "t", "q")
    await redis.flushdb()
    await redis.aclose()


async def admitted(store: RecordStore, key: str = "r1") -> str:
    record = store.keys.record("v1", key)
    verdict, _ = await store.admit_begin(record, "tok", 5000)
    assert verdict == "lead"
    assert await store.admit_commit(
        record, "tok", 60_000, "MSG", {"protocol": "v1", "response": "{}"}
    )
    return record


pytestmark = pytest.mark.anyio


async def test_admission_is_atomic_and_replays(store: RecordStore) -> None:
    record = store.keys.record("v1", "r1")
    assert await store.admit_begin(record, "a", 5000) == ("lead", None)
    assert await store.admit_begin(record, "b", 5000) == ("wait", None)
    assert not await store.admit_commit(record, "b", 60_000, "MSG", {"response": "x"})  # not b's
    assert await store.redis.llen("q") == 0
    assert await store.admit_commit(record, "a", 60_000, "MSG", {"response": "BODY"})
    assert await store.redis.lrange("q", 0, -1) == ["MSG"]
    assert await store.admit_begin(record, "c", 5000) == ("replay", "BODY")
    assert (await store.load(record))["status"] == Status.QUEUED
    assert await store.counts() == (1, 0)


async def test_abort_forgets_only_its_own_admission(store: RecordStore) -> None:
    record = store.keys.record("v1", "r1")
    await store.admit_begin(record, "a", 5000)
    await store.admit_abort(record, "someone-else")
    assert await store.redis.exists(record)
    await store.admit_abort(record, "a")
    assert not await store.redis.exists(record)


async def test_a_duplicate_delivery_of_a_held_rollout_is_busy(store: RecordStore) -> None:
    record = await admitted(store)
    first = await store.claim(record, "w1", LEASE_MS, 5)
    assert (first.verdict, first.attempt) == (Verdict.RUNNING, 1)
    assert first.record["response"] == "{}"
    assert (await store.claim(record, "w2", LEASE_MS, 5)).verdict is Verdict.BUSY


async def test_only_the_owner_finishes_and_terminal_is_sticky(store: RecordStore) -> None:
    record = await admitted(store)
    await store.claim(record, "w1", LEASE_MS, 5)
    assert not await store.finish(record, "w2", Status.SUCCESS, result="x", ttl_ms=RETAIN_MS)
    assert await store.finish(record, "w1", Status.DELIVERING, result="R")
    assert await store.finish(
        record, "w1", Status.SUCCESS, ttl_ms=RETAIN_MS, fields={"delivery": "delivered"}
    )
    saved = await store.load(record)
    assert (saved["status"], saved["result"], saved["delivery"]) == ("success", "R", "delivered")
    assert "owner" not in saved
    assert (await store.claim(record, "w3", LEASE_MS, 5)).verdict is Verdict.DONE
    assert not await store.finish(record, "w1", Status.FAILURE, ttl_ms=RETAIN_MS)
    assert 0 < await store.redis.pttl(record) <= RETAIN_MS
    assert await store.counts() == (0, 1)


async def test_a_lapsed_lease_is_requeued_once_and_taken_over(store: RecordStore) -> None:
    record = await admitted(store)
    await store.redis.delete("q")
    await store.claim(record, "dead", LEASE_MS, 5)
    assert await store.expired(10) == []
    await asyncio.sleep(LEASE_MS / 1000 + 0.05)
    assert await store.expired(10) == [record]
    assert await store.requeue(record, "AGAIN")
    assert not await store.requeue(record, "AGAIN")  # a second sweeper finds nothing to do
    assert await store.redis.lrange("q", 0, -1) == ["AGAIN"]
    assert (await store.load(record))["status"] == Status.QUEUED
    second = await store.claim(record, "w2", LEASE_MS, 5)
    assert (second.verdict, second.attempt) == (Verdict.RUNNING, 2)
    assert not await store.finish(record, "dead", Status.SUCCESS, ttl_ms=RETAIN_MS)


async def test_renewal_keeps_a_lease_and_reports_lost_ones(store: RecordStore) -> None:
    mine = await admitted(store, "mine")
    theirs = await admitted(store, "theirs")
    await store.claim(mine, "w1", LEASE_MS, 5)
    await store.claim(theirs, "w2", LEASE_MS, 5)
    for _ in range(4):
        await asyncio.sleep(LEASE_MS / 2000)
        assert await store.renew("w1", [mine, theirs], LEASE_MS, 60_000) == [theirs]
    assert await store.expired(10) == [theirs]  # w2 never renewed


async def test_a_lapsed_delivery_resumes_as_delivery(store: RecordStore) -> None:
    record = await admitted(store)
    await store.claim(record, "w1", LEASE_MS, 5)
    await store.finish(record, "w1", Status.DELIVERING, result="R")
    await asyncio.sleep(LEASE_MS / 1000 + 0.05)
    assert await store.requeue(record, "AGAIN")
    resumed = await store.claim(record, "w2", LEASE_MS, 5)
    assert resumed.verdict is Verdict.DELIVERING
    assert resumed.record["result"] == "R"


async def test_too_many_attempts_is_exhausted(store: RecordStore) -> None:
    record = await admitted(store)
    for attempt in range(1, 3):
        claim = await store.claim(record, f"w{attempt}", 1, 2)
        assert claim.verdict is Verdict.RUNNING
        await asyncio.sleep(0.01)
    assert (await store.claim(record, "w3", LEASE_MS, 2)).verdict is Verdict.EXHAUSTED


async def test_unknown_records_are_missing(store: RecordStore) -> None:
    assert (await store.claim("t:v1:nope", "w", LEASE_MS, 5)).verdict is Verdict.MISSING
