"""The record state machine (Lua scripts) against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from celery import Celery
from redis.asyncio import Redis

from rollout_fleet.redis_server import RedisServer
from rollout_worker.envelope import UNACKED_INDEX_KEY, UNACKED_KEY, task_message
from rollout_worker.records import RecordStore, Status, Verdict
from rollout_worker.settings import FleetSettings
from rollout_worker.sweeper import Sweeper

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
    first = await store.claim(record, "w1", "w1", LEASE_MS, 5)
    assert (first.verdict, first.attempt) == (Verdict.RUNNING, 1)
    assert first.record["response"] == "{}"
    assert (await store.claim(record, "w2", "w2", LEASE_MS, 5)).verdict is Verdict.BUSY


async def test_only_the_owner_finishes_and_terminal_is_sticky(store: RecordStore) -> None:
    record = await admitted(store)
    await store.claim(record, "w1", "w1", LEASE_MS, 5)
    assert not await store.finish(record, "w2", Status.SUCCESS, result="x", ttl_ms=RETAIN_MS)
    assert await store.finish(record, "w1", Status.DELIVERING, result="R")
    assert await store.finish(
        record, "w1", Status.SUCCESS, ttl_ms=RETAIN_MS, fields={"delivery": "delivered"}
    )
    saved = await store.load(record)
    assert (saved["status"], saved["result"], saved["delivery"]) == ("success", "R", "delivered")
    assert "owner" not in saved
    assert (await store.claim(record, "w3", "w3", LEASE_MS, 5)).verdict is Verdict.DONE
    assert not await store.finish(record, "w1", Status.FAILURE, ttl_ms=RETAIN_MS)
    assert 0 < await store.redis.pttl(record) <= RETAIN_MS
    assert await store.counts() == (0, 1)


async def test_a_lapsed_lease_is_requeued_once_and_taken_over(store: RecordStore) -> None:
    record = await admitted(store)
    await store.redis.delete("q")
    await store.claim(record, "dead", "dead", LEASE_MS, 5)
    assert await store.expired(10) == []
    await asyncio.sleep(LEASE_MS / 1000 + 0.05)
    assert await store.expired(10) == [record]
    assert await store.requeue(record, "AGAIN")
    assert not await store.requeue(record, "AGAIN")  # a second sweeper finds nothing to do
    assert await store.redis.lrange("q", 0, -1) == ["AGAIN"]
    assert (await store.load(record))["status"] == Status.QUEUED
    second = await store.claim(record, "w2", "w2", LEASE_MS, 5)
    assert (second.verdict, second.attempt) == (Verdict.RUNNING, 2)
    assert not await store.finish(record, "dead", Status.SUCCESS, ttl_ms=RETAIN_MS)


async def test_renewal_keeps_a_lease_and_reports_lost_ones(store: RecordStore) -> None:
    mine = await admitted(store, "mine")
    theirs = await admitted(store, "theirs")
    await store.claim(mine, "w1", "w1", LEASE_MS, 5)
    await store.claim(theirs, "w2", "w2", LEASE_MS, 5)
    for _ in range(4):
        await asyncio.sleep(LEASE_MS / 2000)
        lost = await store.renew({"w1": mine, "w1:stale": theirs}, LEASE_MS, 60_000)
        assert lost == ["w1:stale"]
    assert await store.expired(10) == [theirs]  # w2 never renewed


async def test_a_reclaim_by_the_same_worker_is_a_new_lease(store: RecordStore) -> None:
    """Leases are per execution: when a worker's lease lapses and the same process claims the
    rollout again, the stale execution can neither renew, finish nor hand it back."""
    record = await admitted(store)
    await store.claim(record, "w1:a", "w1", LEASE_MS, 5)
    await asyncio.sleep(LEASE_MS / 1000 + 0.05)
    assert await store.requeue(record, "AGAIN")
    await store.claim(record, "w1:b", "w1", LEASE_MS, 5)
    assert (await store.load(record))["worker"] == "w1"
    assert await store.renew({"w1:a": record, "w1:b": record}, LEASE_MS, 60_000) == ["w1:a"]
    assert not await store.finish(record, "w1:a", Status.CANCELLED, ttl_ms=RETAIN_MS)
    assert not await store.release(record, "w1:a", "BACK")
    assert await store.finish(record, "w1:b", Status.SUCCESS, ttl_ms=RETAIN_MS)
    assert (await store.load(record))["status"] == Status.SUCCESS


async def test_a_lapsed_delivery_resumes_as_delivery(store: RecordStore) -> None:
    record = await admitted(store)
    await store.claim(record, "w1", "w1", LEASE_MS, 5)
    await store.finish(record, "w1", Status.DELIVERING, result="R")
    await asyncio.sleep(LEASE_MS / 1000 + 0.05)
    assert await store.requeue(record, "AGAIN")
    resumed = await store.claim(record, "w2", "w2", LEASE_MS, 5)
    assert resumed.verdict is Verdict.DELIVERING
    assert resumed.record["result"] == "R"


async def test_too_many_attempts_is_exhausted(store: RecordStore) -> None:
    record = await admitted(store)
    for attempt in range(1, 3):
        claim = await store.claim(record, f"w{attempt}", f"w{attempt}", 1, 2)
        assert claim.verdict is Verdict.RUNNING
        await asyncio.sleep(0.01)
    assert (await store.claim(record, "w3", "w3", LEASE_MS, 2)).verdict is Verdict.EXHAUSTED


async def test_unknown_records_are_missing(store: RecordStore) -> None:
    assert (await store.claim("t:v1:nope", "w", "w", LEASE_MS, 5)).verdict is Verdict.MISSING


async def test_a_hand_off_requeues_at_once_without_counting_an_attempt(
    store: RecordStore,
) -> None:
    record = await admitted(store)
    await store.redis.delete("q")
    await store.claim(record, "w1", "w1", 60_000, 5)
    assert not await store.release(record, "w2", "BACK")  # only the owner hands back
    assert await store.release(record, "w1", "BACK")
    assert not await store.release(record, "w1", "BACK")  # done once
    assert await store.redis.lrange("q", 0, -1) == ["BACK"]
    saved = await store.load(record)
    assert (saved["status"], saved["attempt"], saved["handoffs"]) == ("queued", "0", "1")
    assert "owner" not in saved
    assert await store.expired(10) == []  # no lease left for a sweeper to find
    assert not await store.finish(record, "w1", Status.SUCCESS, ttl_ms=RETAIN_MS)
    taken = await store.claim(record, "w2", "w2", 60_000, 5)
    assert (taken.verdict, taken.attempt) == (Verdict.RUNNING, 1)


async def test_a_rollout_delivering_its_result_is_not_handed_back(store: RecordStore) -> None:
    record = await admitted(store)
    await store.claim(record, "w1", "w1", 60_000, 5)
    await store.finish(record, "w1", Status.DELIVERING, result="R")
    assert not await store.release(record, "w1", "BACK")
    assert (await store.load(record))["status"] == "delivering"


async def test_a_terminal_record_counts_one_termination(store: RecordStore) -> None:
    record = await admitted(store)
    await store.claim(record, "w1", "w1", LEASE_MS, 5)
    assert await store.finish(record, "w1", Status.SUCCESS, ttl_ms=RETAIN_MS)
    assert not await store.finish(record, "w1", Status.FAILURE, ttl_ms=RETAIN_MS)
    assert (await store.load(record))["terminations"] == "1"


async def test_a_v2_admission_sent_twice_is_one_admission(store: RecordStore) -> None:
    """A gateway retrying its Lua call after a broken connection (the first reply lost) must
    not turn the trainer's own admission into a 409."""
    record = store.keys.record("v2", "r1")
    admit = {"max_queued": 10, "poll_lease_ms": 60_000, "ttl_ms": 60_000, "message": "MSG"}
    fields = {"protocol": "v2"}
    assert await store.admit_v2(record, "r1", lease_digest="d1", fields=fields, **admit) == "queued"
    assert await store.admit_v2(record, "r1", lease_digest="d1", fields=fields, **admit) == "queued"
    assert await store.admit_v2(record, "r1", lease_digest="d2", fields=fields, **admit) == (
        "duplicate"
    )
    assert await store.redis.lrange("q", 0, -1) == ["MSG"]


async def test_an_abandoned_rollout_is_failed_by_its_next_claim(store: RecordStore) -> None:
    """A worker recycling itself (its loop blocked) gives the culprit up with a reason."""
    record = await admitted(store)
    await store.redis.delete("q")
    await store.claim(record, "w1", "w1", 60_000, 5)
    assert await store.release(record, "w1", "BACK", abandon="it blocked the loop")
    assert await store.redis.lrange("q", 0, -1) == ["BACK"]
    assert "handoffs" not in await store.load(record)
    taken = await store.claim(record, "w2", "w2", 60_000, 5)
    assert taken.verdict is Verdict.ABANDONED
    assert taken.record["abandon_reason"] == "it blocked the loop"


async def test_a_rollout_taken_but_never_started_is_queued_again(store: RecordStore) -> None:
    record = await admitted(store)
    await store.redis.delete("q")
    assert await store.release(record, "", "AGAIN")
    assert await store.redis.lrange("q", 0, -1) == ["AGAIN"]
    assert (await store.load(record))["status"] == "queued"
    await store.claim(record, "w1", "w1", 60_000, 5)
    assert not await store.release(record, "", "AGAIN")  # started meanwhile: nothing to do
    assert await store.redis.llen("q") == 1


async def test_a_message_taken_but_never_started_is_restored_once(store: RecordStore) -> None:
    """A worker that dies between taking a rollout's message and claiming it leaves the message
    in kombu's unacked set; the sweeper puts it back instead of waiting for the broker."""
    record = await admitted(store)
    await store.redis.delete("q")
    entry = json.dumps([json.loads(task_message(Celery("t"), record, "r1", "q")), "", "q"])
    await store.redis.hset(UNACKED_KEY, "tag-1", entry)
    await store.redis.zadd(UNACKED_INDEX_KEY, {"tag-1": time.time() - 60})
    assert await store.stale_deliveries(time.time() - 120, 10) == []  # not old enough
    assert await store.stale_deliveries(time.time() - 30, 10) == [("tag-1", record)]
    assert await store.restore_unstarted(record, "tag-1", "AGAIN")
    assert await store.redis.lrange("q", 0, -1) == ["AGAIN"]
    assert await store.redis.hlen(UNACKED_KEY) == 0
    assert await store.stale_deliveries(time.time(), 10) == []
    assert not await store.restore_unstarted(record, "tag-1", "AGAIN")  # once


async def test_a_started_rollout_is_not_restored(store: RecordStore) -> None:
    record = await admitted(store)
    await store.redis.delete("q")
    await store.claim(record, "w1", "w1", 60_000, 5)
    await store.redis.hset(UNACKED_KEY, "tag-2", "[]")
    assert not await store.restore_unstarted(record, "tag-2", "AGAIN")
    assert await store.redis.llen("q") == 0
    assert await store.redis.hlen(UNACKED_KEY) == 1  # the live worker acks it


async def admitted_with_message(store: RecordStore, key: str) -> str:
    record = store.keys.record("v1", key)
    await store.admit_begin(record, "tok", 5000)
    message = task_message(Celery("t"), record, key, "q")
    assert await store.admit_commit(record, "tok", 60_000, message, {"protocol": "v1"})
    return record


async def test_a_waiting_rollout_whose_message_vanished_is_found(store: RecordStore) -> None:
    """Only a rollout waiting for a worker whose message is in neither the queue nor kombu's
    unacked set counts as lost."""
    queued, taken, vanished, running = [
        await admitted_with_message(store, key) for key in ("queued", "taken", "gone", "run")
    ]
    message = {record: task_message(Celery("t"), record, "-", "q") for record in (taken, vanished)}
    await store.redis.delete("q")
    await store.redis.lpush("q", task_message(Celery("t"), queued, "-", "q"))
    await store.redis.hset(UNACKED_KEY, "tag-1", json.dumps([json.loads(message[taken]), "", "q"]))
    await store.claim(running, "w1", "w1", 60_000, 5)
    assert await store.waiting_without_message() == {vanished}
    assert await store.resend(vanished, message[vanished], 60_000)
    assert await store.waiting_without_message() == set()
    assert not await store.resend(vanished, message[vanished], 60_000)  # once per guard period
    assert not await store.resend(running, "RUN", 0)  # it runs: nothing lost
    assert await store.redis.llen("q") == 2


async def test_the_sweeper_resends_a_lost_message_after_two_checks(store: RecordStore) -> None:
    settings = FleetSettings(lease_seconds=0.05)  # checks every 0.2 s
    sweeper = Sweeper(store, lambda record: f"AGAIN {record}", settings)
    record = await admitted_with_message(store, "r1")
    await store.redis.delete("q")
    assert await sweeper.sweep() == 0  # a suspect: its message may just have been moving
    assert await sweeper.sweep() == 0  # not this worker's turn yet: one check per period
    await asyncio.sleep(0.25)
    assert await sweeper.sweep() == 1
    assert await store.redis.lrange("q", 0, -1) == [f"AGAIN {record}"]


async def test_lapsed_leases_wait_one_lease_after_a_redis_restart() -> None:
    """A Redis restart lapses every lease (nobody could renew): a sweep in the first lease
    after it leaves them to their owners; later sweeps requeue the ones still lapsed."""
    server = RedisServer().start()  # uptime 0, like a Redis that just came back
    redis = Redis.from_url(server.url, decode_responses=True)
    try:
        store = RecordStore(redis, "t", "q")
        sweeper = Sweeper(store, lambda record: f"AGAIN {record}", FleetSettings(lease_seconds=2))
        record = await admitted(store)
        await store.claim(record, "owner", "worker", LEASE_MS, 5)
        await asyncio.sleep(LEASE_MS / 1000 + 0.05)
        assert await store.expired(10) == [record]
        assert await sweeper.sweep() == 0
        assert (await store.load(record))["status"] == Status.RUNNING
        await asyncio.sleep(2.2 - await store.redis_uptime())  # uptime counts whole seconds
        assert await store.redis_uptime() >= 2
        assert await sweeper.sweep() == 1
        assert (await store.load(record))["status"] == Status.QUEUED
    finally:
        await redis.aclose()
        server.stop()
