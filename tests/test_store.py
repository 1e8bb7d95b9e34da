"""The record store and its state machine (the Lua scripts) against a real redis-server.

``redis`` is a plain client that observes what the store wrote; only the store changes it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from celery import Celery
from redis.asyncio import Redis

from rollout_core.protocols import v2 as v2_records
from rollout_core.queue.envelope import admission_message, task_message
from rollout_core.settings import FleetSettings
from rollout_core.store import (
    AdmitOutcome,
    AdmitStart,
    Advance,
    CancelOutcome,
    PollOutcome,
    RecordField,
    RecordKey,
    RecordStore,
    Status,
    Verdict,
    replies,
)
from rollout_core.store.schema import UNACKED, UNACKED_INDEX, ClockField
from rollout_core.store.scripts import Script
from rollout_fleet.redis_server import RedisServer
from rollout_sdk.types import RolloutResultResponse, RolloutStatus
from rollout_worker.sweeper import Sweeper

LEASE = 0.2
RETAIN = 60.0
PROTOCOL = {RecordField.PROTOCOL: "v1", RecordField.RESPONSE: "{}"}

pytestmark = pytest.mark.anyio


def fleet(url: str, lease_seconds: float = 3) -> FleetSettings:
    return FleetSettings(
        redis_url=url, key_prefix="t", queue="q", lease_seconds=lease_seconds, secret_key=None
    )


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url_for(1001), decode_responses=True)
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()


@pytest.fixture
async def store(redis_server: RedisServer, redis: Redis) -> AsyncIterator[RecordStore]:
    store = RecordStore.connect(fleet(redis_server.url_for(1001)))
    yield store
    await store.aclose()


@pytest.fixture
async def alone() -> AsyncIterator[tuple[RecordStore, Redis]]:
    """A store on a Redis server of its own: what Redis counts (commands, bytes sent) is this
    test's alone, not also that of fleets other tests left running on the shared server."""
    server = RedisServer().start()
    client = Redis.from_url(server.url_for(0), decode_responses=True)
    store = RecordStore.connect(fleet(server.url_for(0)))
    try:
        yield store, client
    finally:
        await store.aclose()
        await client.aclose()
        server.stop()


async def admitted(store: RecordStore, record_id: str = "r1", message: str = "MSG") -> RecordKey:
    key = store.keys.record("v1", record_id)
    assert (await store.admit_begin(key, "tok", 5)).start is AdmitStart.LEAD
    assert await store.admit_commit(key, "tok", 60, message, PROTOCOL)
    return key


async def test_admission_is_atomic_and_replays(store: RecordStore, redis: Redis) -> None:
    key = store.keys.record("v1", "r1")
    assert (await store.admit_begin(key, "a", 5)).start is AdmitStart.LEAD
    assert (await store.admit_begin(key, "b", 5)).start is AdmitStart.WAIT
    assert not await store.admit_commit(key, "b", 60, "MSG", {RecordField.RESPONSE: "x"})
    assert await redis.llen("q") == 0
    assert await store.admit_commit(key, "a", 60, "MSG", {RecordField.RESPONSE: "BODY"})
    assert await redis.lrange("q", 0, -1) == ["MSG"]
    replay = await store.admit_begin(key, "c", 5)
    assert (replay.start, replay.response) == (AdmitStart.REPLAY, "BODY")
    assert (await store.load(key)).status is Status.QUEUED
    counts = await store.counts()
    assert (counts.active, counts.running, counts.finished) == (1, 0, 0)


async def test_a_commit_run_again_changes_nothing(store: RecordStore, redis: Redis) -> None:
    """A v1 commit whose reply was lost and which the client runs again (the admission token
    stays in a committed record) enqueues nothing more and leaves the rollout as it is; nor
    can the admission that committed it abort it afterwards."""
    key = await admitted(store)
    claim = await store.claim(key, "ex-1", "w", 10, 3)
    assert claim.verdict is Verdict.RUNNING
    assert not await store.admit_commit(key, "tok", 60, "MSG-AGAIN", PROTOCOL)
    await store.admit_abort(key, "tok")
    assert await redis.lrange("q", 0, -1) == ["MSG"]
    record = await store.load(key)
    assert (record.status, record.attempt) == (Status.RUNNING, 1)


async def test_abort_forgets_only_its_own_admission(store: RecordStore, redis: Redis) -> None:
    key = store.keys.record("v1", "r1")
    await store.admit_begin(key, "a", 5)
    await store.admit_abort(key, "someone-else")
    assert await redis.exists(key)
    await store.admit_abort(key, "a")
    assert not await redis.exists(key)


async def test_a_duplicate_delivery_of_a_held_rollout_is_busy(store: RecordStore) -> None:
    key = await admitted(store)
    first = await store.claim(key, "w1", "w1", LEASE, 5)
    assert (first.verdict, first.attempt) == (Verdict.RUNNING, 1)
    assert first.record.response == "{}"
    assert first.since_accepted >= 0
    assert (await store.claim(key, "w2", "w2", LEASE, 5)).verdict is Verdict.BUSY


async def test_only_the_lease_holder_finishes_and_terminal_is_sticky(
    store: RecordStore, redis: Redis
) -> None:
    key = await admitted(store)
    await store.claim(key, "w1", "w1", LEASE, 5)
    moved = await store.advance(key, "w2", Status.SUCCESS, result="x", retention_seconds=RETAIN)
    assert moved is Advance.LOST
    moved = await store.advance(key, "w1", Status.DELIVERING, result="R")
    assert moved is Advance.MOVED
    moved = await store.advance(
        key,
        "w1",
        Status.SUCCESS,
        retention_seconds=RETAIN,
        fields={RecordField.DELIVERY: "delivered"},
    )
    assert moved is Advance.MOVED
    saved = await store.load(key)
    assert (saved.status, saved.result, saved.delivery) == (Status.SUCCESS, "R", "delivered")
    assert await redis.hget(key, RecordField.EXECUTION) == ""  # the lease holder emptied
    assert (await store.claim(key, "w3", "w3", LEASE, 5)).verdict is Verdict.DONE
    moved = await store.advance(key, "w1", Status.FAILURE, retention_seconds=RETAIN)
    assert moved is Advance.LOST
    assert 0 < await redis.pttl(key) <= RETAIN * 1000
    assert (await store.counts()).finished == 1


async def test_a_lapsed_lease_is_requeued_once_and_taken_over(
    store: RecordStore, redis: Redis
) -> None:
    key = await admitted(store)
    await redis.delete("q")
    await store.claim(key, "dead", "dead", LEASE, 5)
    assert await store.lapsed_leases(10) == []
    await asyncio.sleep(LEASE + 0.05)
    assert await store.lapsed_leases(10) == [key]
    assert await store.requeue(key, "AGAIN", 5)
    assert not await store.requeue(key, "AGAIN", 5)  # a second sweeper finds nothing to do
    assert await redis.lrange("q", 0, -1) == ["AGAIN"]
    assert (await store.load(key)).status is Status.QUEUED
    second = await store.claim(key, "w2", "w2", LEASE, 5)
    assert (second.verdict, second.attempt) == (Verdict.RUNNING, 2)
    moved = await store.advance(key, "dead", Status.SUCCESS, retention_seconds=RETAIN)
    assert moved is Advance.LOST


async def test_renewal_keeps_a_lease_and_reports_lost_ones(store: RecordStore) -> None:
    mine = await admitted(store, "mine")
    theirs = await admitted(store, "theirs")
    await store.claim(mine, "w1", "w1", LEASE, 5)
    await store.claim(theirs, "w2", "w2", LEASE, 5)
    for _ in range(4):
        await asyncio.sleep(LEASE / 2)
        lost, stop = await store.renew({"w1": mine, "w1:stale": theirs}, LEASE, 60)
        assert (lost, stop) == (["w1:stale"], [])
    assert await store.lapsed_leases(10) == [theirs]  # w2 never renewed


async def test_a_reclaim_by_the_same_worker_is_a_new_lease(store: RecordStore) -> None:
    """Leases are per execution: when a worker's lease lapses and the same process claims the
    rollout again, the stale execution can neither renew, finish nor hand it back."""
    key = await admitted(store)
    await store.claim(key, "w1:a", "w1", LEASE, 5)
    await asyncio.sleep(LEASE + 0.05)
    assert await store.requeue(key, "AGAIN", 5)
    await store.claim(key, "w1:b", "w1", LEASE, 5)
    assert (await store.load(key)).worker == "w1"
    assert await store.renew({"w1:a": key, "w1:b": key}, LEASE, 60) == (["w1:a"], [])
    moved = await store.advance(key, "w1:a", Status.CANCELLED, retention_seconds=RETAIN)
    assert moved is Advance.LOST
    assert not await store.hand_back(key, "w1:a", "BACK")
    moved = await store.advance(key, "w1:b", Status.SUCCESS, retention_seconds=RETAIN)
    assert moved is Advance.MOVED
    assert (await store.load(key)).status is Status.SUCCESS


async def test_a_lapsed_delivery_resumes_as_delivery(store: RecordStore) -> None:
    key = await admitted(store)
    await store.claim(key, "w1", "w1", LEASE, 5)
    await store.advance(key, "w1", Status.DELIVERING, result="R")
    await asyncio.sleep(LEASE + 0.05)
    assert await store.requeue(key, "AGAIN", 5)
    resumed = await store.claim(key, "w2", "w2", LEASE, 5)
    assert resumed.verdict is Verdict.DELIVERING
    assert resumed.record.result == "R"


async def test_too_many_attempts_is_exhausted(store: RecordStore) -> None:
    key = await admitted(store)
    for attempt in range(1, 3):
        claim = await store.claim(key, f"w{attempt}", f"w{attempt}", 0.001, 2, alone=True)
        assert claim.verdict is Verdict.RUNNING
        await asyncio.sleep(0.01)
    assert (await store.claim(key, "w3", "w3", LEASE, 2)).verdict is Verdict.EXHAUSTED


@pytest.mark.parametrize("takeover", ["claim", "requeue"])
async def test_a_crash_counts_only_against_a_rollout_that_ran_alone(
    store: RecordStore, takeover: str
) -> None:
    """A crash of a worker running other rollouts too may have been theirs: it is forgiven
    (not counted against max_attempts), at most max_attempts + 2 times; a crash of an execution
    that ran alone (marked at the claim or afterwards) counts. Both takeovers agree: a claim of
    the lapsed lease, and the sweeper's requeue."""
    key = await admitted(store)

    async def crash_of(execution: str, *, alone: bool = False, mark: bool = False) -> Verdict:
        claim = await store.claim(key, execution, execution, LEASE, 2, alone=alone)
        if mark:
            assert await store.mark_alone(key, execution)
        await asyncio.sleep(LEASE + 0.05)
        if takeover == "requeue":
            assert await store.requeue(key, "AGAIN", 2)
        return claim.verdict

    # Shared crashes: forgiven four times (max_attempts + 2), the fifth counts.
    assert [await crash_of(f"s{n}") for n in range(5)] == [Verdict.RUNNING] * 5
    record = await store.load(key)
    assert (record.attempt, record.forgiven) == (5, 4)
    # One counted so far (the fifth shared crash): one more alone, then it is exhausted.
    assert await crash_of("a1", mark=True) is Verdict.RUNNING
    assert (await store.load(key)).alone == "a1"
    last = await store.claim(key, "a2", "a2", LEASE, 2, alone=True)
    assert (last.verdict, last.attempt, last.record.forgiven) == (Verdict.EXHAUSTED, 7, 4)


async def test_a_crash_alone_counts_and_marking_needs_the_lease(store: RecordStore) -> None:
    key = await admitted(store)
    await store.claim(key, "a1", "a1", LEASE, 1, alone=True)
    await asyncio.sleep(LEASE + 0.05)
    assert not await store.mark_alone(key, "someone-else")
    assert (await store.claim(key, "a2", "a2", LEASE, 1)).verdict is Verdict.EXHAUSTED
    assert (await store.load(key)).forgiven == 0


async def test_unknown_records_are_missing(store: RecordStore) -> None:
    nope = store.keys.record("v1", "nope")
    assert (await store.claim(nope, "w", "w", LEASE, 5)).verdict is Verdict.MISSING
    assert not (await store.load(nope)).admitted
    assert await store.find("nope") is None


async def test_a_hand_back_requeues_at_once_without_counting_an_attempt(
    store: RecordStore, redis: Redis
) -> None:
    key = await admitted(store)
    await redis.delete("q")
    await store.claim(key, "w1", "w1", 60, 5)
    assert not await store.hand_back(key, "w2", "BACK")  # only the lease holder hands back
    assert await store.hand_back(key, "w1", "BACK")
    assert not await store.hand_back(key, "w1", "BACK")  # done once
    assert await redis.lrange("q", 0, -1) == ["BACK"]
    saved = await redis.hgetall(key)
    assert (saved[RecordField.STATUS], saved[RecordField.ATTEMPT]) == ("queued", "0")
    assert saved[RecordField.HANDED_BACK] == "1"
    assert RecordField.EXECUTION not in saved
    assert await store.lapsed_leases(10) == []  # no lease left for a sweeper to find
    moved = await store.advance(key, "w1", Status.SUCCESS, retention_seconds=RETAIN)
    assert moved is Advance.LOST
    taken = await store.claim(key, "w2", "w2", 60, 5)
    assert (taken.verdict, taken.attempt) == (Verdict.RUNNING, 1)


async def test_a_rollout_delivering_its_result_is_handed_back_only_unposted(
    store: RecordStore, redis: Redis
) -> None:
    """Its callback may be in flight: handed back only when the worker says none went out
    (and none will); then it stays delivering, its stored result for the next claim, which
    counts the same attempt and delivery as before it."""
    key = await admitted(store)
    await redis.delete("q")
    await store.claim(key, "w1", "w1", 60, 5)
    await store.advance(key, "w1", Status.DELIVERING, result="R")
    assert not await store.hand_back(key, "w1", "BACK")
    assert not await store.hand_back(key, "w2", "BACK", unposted=True)  # not its lease
    assert await store.hand_back(key, "w1", "BACK", unposted=True)
    assert not await store.hand_back(key, "w1", "BACK", unposted=True)  # done once
    assert await redis.lrange("q", 0, -1) == ["BACK"]
    record = await store.load(key)
    assert (record.status, record.result, record.attempt) == (Status.DELIVERING, "R", 0)
    assert await store.lapsed_leases(10) == []
    taken = await store.claim(key, "w2", "w2", 60, 5)
    assert (taken.verdict, taken.attempt, taken.record.deliveries) == (Verdict.DELIVERING, 1, 0)


async def test_a_terminal_record_counts_one_termination(store: RecordStore, redis: Redis) -> None:
    key = await admitted(store)
    await store.claim(key, "w1", "w1", LEASE, 5)
    moved = await store.advance(key, "w1", Status.SUCCESS, retention_seconds=RETAIN)
    assert moved is Advance.MOVED
    moved = await store.advance(key, "w1", Status.FAILURE, retention_seconds=RETAIN)
    assert moved is Advance.LOST
    assert await redis.hget(key, RecordField.TERMINATIONS) == "1"


async def test_an_ending_write_sent_again_answers_as_the_first_did(
    store: RecordStore, redis: Redis
) -> None:
    """redis-py sends a command again when its reply timed out, and the first may have landed
    (a starved worker's loop reads it late): the execution that ended the rollout then hears
    what its write did, not that it lost the rollout; nobody else does."""
    key = await admitted(store)
    await store.claim(key, "w1", "w1", LEASE, 5)
    for _ in range(2):
        moved = await store.advance(key, "w1", Status.SUCCESS, retention_seconds=RETAIN)
        assert moved is Advance.MOVED
    assert await redis.hget(key, RecordField.TERMINATIONS) == "1"
    assert await store.advance(key, "w2", Status.SUCCESS, retention_seconds=RETAIN) is Advance.LOST
    assert await store.advance(key, "w1", Status.FAILURE, retention_seconds=RETAIN) is Advance.LOST

    cancelled = await admitted(store, "r2", "MSG2")
    await store.claim(cancelled, "w1:c", "w1", LEASE, 5)
    await redis.hset(cancelled, RecordField.CANCEL_REQUESTED, "1")
    for _ in range(2):
        moved = await store.advance(
            cancelled, "w1:c", Status.SUCCESS, retention_seconds=RETAIN, cancelled_result="C"
        )
        assert moved is Advance.CANCELLED
    saved = await store.load(cancelled)
    assert (saved.status, saved.result) == (Status.CANCELLED, "C")
    assert await redis.hget(cancelled, RecordField.TERMINATIONS) == "1"


async def v2_admit(store: RecordStore, record_id: str, digest: str) -> AdmitOutcome:
    return await store.admit_v2(
        store.keys.record("v2", record_id),
        max_queued=10,
        polling_lease_seconds=60,
        ttl_seconds=60,
        message="MSG",
        lease_digest=digest,
        fields={RecordField.PROTOCOL: "v2", RecordField.ROLLOUT_ID: record_id},
    )


async def test_a_v2_admission_sent_twice_is_one_admission(store: RecordStore, redis: Redis) -> None:
    """A gateway retrying its Lua call after a broken connection (the first reply lost) must
    not turn the trainer's own admission into a 409."""
    assert await v2_admit(store, "r1", "d1") is AdmitOutcome.QUEUED
    assert await v2_admit(store, "r1", "d1") is AdmitOutcome.QUEUED
    assert await v2_admit(store, "r1", "d2") is AdmitOutcome.DUPLICATE
    assert await redis.lrange("q", 0, -1) == ["MSG"]
    assert await store.v2_ids("r") == ["r1"]


async def test_v2_admissions_are_refused_while_fenced(store: RecordStore) -> None:
    await store.fence_admissions(60)
    assert await store.admissions_fenced()
    assert await v2_admit(store, "r1", "d1") is AdmitOutcome.DRAINING
    await store.lift_fence()
    assert await v2_admit(store, "r1", "d1") is AdmitOutcome.QUEUED


async def test_the_results_the_fleet_makes_are_the_models_wire_results(
    store: RecordStore, redis: Redis
) -> None:
    """Nothing on the wire is assembled in Lua: a cancelled queued rollout and an expired
    polling lease store (and a poll returns) the results the SDK's models build."""
    await v2_admit(store, "c1", "d1")
    cancelled = store.keys.record("v2", "c1")
    outcomes = await store.cancel({cancelled: v2_records.cancelled_json("c1")}, RETAIN)
    assert outcomes == {cancelled: CancelOutcome.CANCELLED_QUEUED}
    stored = RolloutResultResponse.model_validate_json(await redis.hget(cancelled, "result"))
    assert (stored.rollout_id, stored.status) == ("c1", RolloutStatus.CANCELLED)
    assert await store.cancel({cancelled: ""}, RETAIN) == {cancelled: CancelOutcome.FINISHED}

    await v2_admit(store, "e1", "d1")
    expired = store.keys.record("v2", "e1")
    await redis.zadd(store.keys.polling_leases, {expired: 0})  # the lease ran out
    reply = await store.poll(
        expired,
        "d1",
        polling_lease_seconds=60,
        retention_seconds=RETAIN,
        lease_expired_result=v2_records.lease_expired_json("e1"),
    )
    assert reply.outcome is PollOutcome.FINAL
    assert reply.result is not None
    final = RolloutResultResponse.model_validate_json(reply.result)
    assert (final.status, final.err_category) == (RolloutStatus.FAILURE, "lease_expired")
    assert reply.result == await redis.hget(expired, "result")


async def test_polls_authenticate_renew_and_report(store: RecordStore) -> None:
    await v2_admit(store, "p1", "d1")
    key = store.keys.record("v2", "p1")
    poll = {"polling_lease_seconds": 60, "retention_seconds": RETAIN, "lease_expired_result": "X"}
    assert (await store.poll(key, "d2", **poll)).outcome is PollOutcome.FORBIDDEN
    reply = await store.poll(key, "d1", **poll)
    assert (reply.outcome, reply.status) == (PollOutcome.STATUS, Status.QUEUED)
    missing = store.keys.record("v2", "nope")
    assert (await store.poll(missing, "d1", **poll)).outcome is PollOutcome.UNKNOWN


async def test_the_sweeper_expires_unpolled_rollouts_once(store: RecordStore, redis: Redis) -> None:
    sweeper = Sweeper(store, lambda key: f"AGAIN {key}", fleet("redis://unused"))
    await v2_admit(store, "u1", "d1")
    await v2_admit(store, "u2", "d1")
    overdue = store.keys.record("v2", "u1")
    await redis.zadd(store.keys.polling_leases, {overdue: 0})
    assert await store.overdue_polling_leases(10) == [overdue]
    await sweeper.sweep()
    result = RolloutResultResponse.model_validate_json(await redis.hget(overdue, "result"))
    assert (result.rollout_id, result.err_category) == ("u1", "lease_expired")
    assert await store.overdue_polling_leases(10) == []
    assert (await store.load(store.keys.record("v2", "u2"))).status is Status.QUEUED


async def _outage(store: RecordStore, redis: Redis, seconds: float) -> int:
    """Make the polling clock read as if no fleet process had reached Redis for ``seconds``
    (Redis stopped, restarting, cut off); Redis's time now (ms, as the scripts read it)."""
    whole, micros = await redis.time()
    now = whole * 1000 + micros // 1000
    await redis.hset(store.keys.clock, ClockField.TICK, now - round(seconds * 1000))
    return now


async def test_time_nobody_reached_redis_does_not_count_against_a_polling_lease(
    store: RecordStore, redis: Redis
) -> None:
    """No fleet process reached Redis for 10 s: a lease still running when the last one did
    is moved on by those 10 s, whoever looks first (a poll here, a sweep below); one that
    had run out before stays run out; and the clock says what it found, once."""
    for rollout in ("polled", "swept", "overdue"):
        await v2_admit(store, rollout, "d1")
    polled, swept, overdue = (store.keys.record("v2", r) for r in ("polled", "swept", "overdue"))
    now = await _outage(store, redis, 10)
    deadlines = {polled: now - 5000, swept: now - 4000, overdue: now - 11_000}
    await redis.zadd(store.keys.polling_leases, deadlines)
    poll = {"polling_lease_seconds": 60, "retention_seconds": RETAIN, "lease_expired_result": "X"}
    reply = await store.poll(polled, "d1", **poll)
    assert (reply.outcome, reply.status) == (PollOutcome.STATUS, Status.QUEUED)
    assert await store.overdue_polling_leases(10) == [overdue]
    moved = await redis.zscore(store.keys.polling_leases, swept)
    assert moved is not None
    assert now + 6000 <= moved < now + 16_000  # moved on by the gap
    outages, away = await store.tick()
    assert outages == 1
    assert 10 <= away < 20
    assert await store.tick() == (outages, away)  # found once


async def test_a_lease_nobody_renews_still_runs_out_after_an_outage(
    store: RecordStore, redis: Redis
) -> None:
    """The outage is added once: from then on the lease runs as before, and a sweep expires
    it when it runs out."""
    sweeper = Sweeper(store, lambda key: f"AGAIN {key}", fleet("redis://unused"))
    await v2_admit(store, "gone", "d1")
    key = store.keys.record("v2", "gone")
    now = await _outage(store, redis, 10)
    await redis.zadd(store.keys.polling_leases, {key: now - 9500})  # 0.5 s left at the last tick
    await sweeper.sweep()
    assert (await store.load(key)).status is Status.QUEUED
    await asyncio.sleep(0.8)
    await sweeper.sweep()
    result = RolloutResultResponse.model_validate_json(await redis.hget(key, "result"))
    assert result.err_category == "lease_expired"


async def test_an_abandoned_rollout_is_failed_by_its_next_claim(
    store: RecordStore, redis: Redis
) -> None:
    """A worker recycling itself (its loop blocked) gives the culprit up with a reason."""
    key = await admitted(store)
    await redis.delete("q")
    await store.claim(key, "w1", "w1", 60, 5)
    assert await store.hand_back(key, "w1", "BACK", abandon="it blocked the loop")
    assert await redis.lrange("q", 0, -1) == ["BACK"]
    assert not await redis.hexists(key, RecordField.HANDED_BACK)
    taken = await store.claim(key, "w2", "w2", 60, 5)
    assert taken.verdict is Verdict.ABANDONED
    assert taken.record.abandon_reason == "it blocked the loop"


async def test_a_rollout_taken_but_never_started_is_queued_again(
    store: RecordStore, redis: Redis
) -> None:
    key = await admitted(store)
    await redis.delete("q")
    assert await store.hand_back(key, "", "AGAIN")
    assert await redis.lrange("q", 0, -1) == ["AGAIN"]
    assert (await store.load(key)).status is Status.QUEUED
    await store.claim(key, "w1", "w1", 60, 5)
    assert not await store.hand_back(key, "", "AGAIN")  # started meanwhile: nothing to do
    assert await redis.llen("q") == 1


async def test_a_message_taken_but_never_started_is_restored_once(
    store: RecordStore, redis: Redis
) -> None:
    """A worker that dies between taking a rollout's message and claiming it leaves the message
    in kombu's unacked set; the sweeper puts it back instead of waiting for the broker."""
    key = await admitted(store)
    await redis.delete("q")
    entry = json.dumps([json.loads(task_message(Celery("t"), key, "r1", "q")), "", "q"])
    await redis.hset(UNACKED, "tag-1", entry)
    await redis.zadd(UNACKED_INDEX, {"tag-1": time.time() - 60})
    assert await store.stale_taken_messages(time.time() - 120, 10) == []  # not old enough
    assert await store.stale_taken_messages(time.time() - 30, 10) == [("tag-1", key)]
    assert await store.restore_unstarted(key, "tag-1", "AGAIN")
    assert await redis.lrange("q", 0, -1) == ["AGAIN"]
    assert await redis.hlen(UNACKED) == 0
    assert await store.stale_taken_messages(time.time(), 10) == []
    assert not await store.restore_unstarted(key, "tag-1", "AGAIN")  # once


async def test_a_started_rollout_is_not_restored(store: RecordStore, redis: Redis) -> None:
    key = await admitted(store)
    await redis.delete("q")
    await store.claim(key, "w1", "w1", 60, 5)
    await redis.hset(UNACKED, "tag-2", "[]")
    assert not await store.restore_unstarted(key, "tag-2", "AGAIN")
    assert await redis.llen("q") == 0
    assert await redis.hlen(UNACKED) == 1  # the live worker acks it


async def admitted_with_message(store: RecordStore, record_id: str) -> RecordKey:
    key = store.keys.record("v1", record_id)
    return await admitted(store, record_id, task_message(Celery("t"), key, record_id, "q"))


async def test_a_waiting_rollout_whose_message_vanished_is_found(
    store: RecordStore, redis: Redis
) -> None:
    """Only a rollout waiting for a worker whose message is in neither the queue nor kombu's
    unacked set counts as lost."""
    queued, taken, vanished, running = [
        await admitted_with_message(store, key) for key in ("queued", "taken", "gone", "run")
    ]
    message = {key: task_message(Celery("t"), key, "-", "q") for key in (taken, vanished)}
    await redis.delete("q")
    await redis.lpush("q", task_message(Celery("t"), queued, "-", "q"))
    await redis.hset(UNACKED, "tag-1", json.dumps([json.loads(message[taken]), "", "q"]))
    await store.claim(running, "w1", "w1", 60, 5)
    assert await store.waiting_without_message() == {vanished}
    assert await store.resend(vanished, message[vanished], 60)
    assert await store.waiting_without_message() == set()
    assert not await store.resend(vanished, message[vanished], 60)  # once per guard period
    assert not await store.resend(running, "RUN", 0)  # it runs: nothing lost
    assert await redis.llen("q") == 2


async def test_the_sweeper_resends_a_lost_message_after_two_checks(
    store: RecordStore, redis: Redis
) -> None:
    sweeper = Sweeper(store, lambda key: f"AGAIN {key}", fleet("redis://unused", 1))
    key = await admitted_with_message(store, "r1")  # checks every 4 s
    await redis.delete("q")
    assert await sweeper.sweep() == 0  # a suspect: its message may just have been moving
    assert await sweeper.sweep() == 0  # not this worker's turn yet: one check per period
    await asyncio.sleep(4.1)
    assert await sweeper.sweep() == 1
    assert await redis.lrange("q", 0, -1) == [f"AGAIN {key}"]


async def test_lapsed_leases_wait_two_leases_after_a_redis_restart() -> None:
    """A Redis restart lapses every lease (nobody could renew): a sweep in the first two
    leases after it leaves them to their holders; later sweeps requeue the ones still lapsed."""
    server = RedisServer().start()  # uptime 0, like a Redis that just came back
    settings = fleet(server.url, lease_seconds=1)
    store = RecordStore.connect(settings)
    try:
        long_ago = time.monotonic() - 60  # the sweeper's own start-up hold-off is long over
        sweeper = Sweeper(store, lambda key: f"AGAIN {key}", settings, started=long_ago)
        key = await admitted(store)
        await store.claim(key, "execution", "worker", LEASE, 5)
        await asyncio.sleep(LEASE + 0.05)
        assert await store.lapsed_leases(10) == [key]
        assert await sweeper.sweep() == 0
        assert (await store.load(key)).status is Status.RUNNING
        await asyncio.sleep(1.2 - await store.redis_uptime())  # uptime counts whole seconds
        if await store.redis_uptime() < 2:
            assert await sweeper.sweep() == 0  # a lease after the restart is not enough
        await asyncio.sleep(2.2 - await store.redis_uptime())
        assert await store.redis_uptime() >= 2
        assert await sweeper.sweep() == 1
        assert (await store.load(key)).status is Status.QUEUED
    finally:
        await store.aclose()
        server.stop()


async def test_a_sweeper_leaves_lapsed_leases_alone_for_two_leases_after_it_starts(
    store: RecordStore,
) -> None:
    """A worker that starts during or right after a Redis outage it never saw (no failure of
    its own, Redis not restarted) must not take over rollouts whose live holders could not
    renew yet: its sweeper waits two leases from its start."""
    settings = fleet("redis://unused", lease_seconds=1)
    key = await admitted(store)
    await store.claim(key, "execution", "worker", LEASE, 5)
    await asyncio.sleep(LEASE + 0.05)
    assert await store.lapsed_leases(10) == [key]
    await asyncio.sleep(max(0.0, 2.1 - await store.redis_uptime()))  # no restart to excuse it
    started = time.monotonic()
    sweeper = Sweeper(store, lambda key: f"AGAIN {key}", settings)
    while time.monotonic() - started < 1.8:
        assert await sweeper.sweep() == 0
        await asyncio.sleep(0.2)
    assert (await store.load(key)).status is Status.RUNNING
    await asyncio.sleep(2.1 - (time.monotonic() - started))
    assert await sweeper.sweep() == 1
    assert (await store.load(key)).status is Status.QUEUED


# --- delivery, claims, cancels and the lost-message check, at the level of the scripts -------


async def test_a_lapsed_delivery_is_delivered_never_exhausted(store: RecordStore) -> None:
    """Past max_attempts, a delivering rollout keeps its stored result."""
    key = await admitted(store)
    await store.claim(key, "w1", "w1", LEASE, 1)
    await store.advance(key, "w1", Status.DELIVERING, result="COMPLETED")
    await asyncio.sleep(LEASE + 0.05)
    assert await store.requeue(key, "AGAIN", 5)
    again = await store.claim(key, "w2", "w2", LEASE, 1)
    assert (again.verdict, again.attempt, again.record.result) == (
        Verdict.DELIVERING,
        2,
        "COMPLETED",
    )


@pytest.mark.parametrize("status", [Status.RUNNING, Status.DELIVERING])
async def test_a_full_redis_still_requeues_and_is_no_trouble(
    store: RecordStore, redis: Redis, status: Status
) -> None:
    """At ``maxmemory`` Redis still runs the scripts that move admitted work on: a lapsed
    lease is requeued (a renewal would have gone through too, so it lapsed for a crash), and
    the full Redis holds no sweeper off."""
    key = await admitted(store)
    await store.claim(key, "w1", "w1", LEASE, 5)
    if status is Status.DELIVERING:
        await store.advance(key, "w1", Status.DELIVERING, result="COMPLETED")
    await asyncio.sleep(LEASE + 0.05)
    queued = await redis.llen("q")
    before = store.seconds_since_trouble()
    await redis.config_set("maxmemory", "1")
    try:
        assert await store.requeue(key, "AGAIN", 5)
        assert store.seconds_since_trouble() >= before
    finally:
        await redis.config_set("maxmemory", "0")
    waiting = Status.QUEUED if status is Status.RUNNING else status  # delivering: its result
    assert (await store.load(key)).status is waiting
    assert await redis.hget(key, RecordField.EXECUTION) is None
    assert await redis.zscore(store.keys.leases, key) is None
    assert await redis.llen("q") == queued + 1


async def test_a_delivery_that_keeps_failing_runs_out_of_its_own_attempts(
    store: RecordStore,
) -> None:
    """A stored result counts its deliveries apart from its runs: past max_attempts of them
    the claim answers ``exhausted`` with the result still there (the worker ends it); a
    rollout whose runs used up its attempts is still delivered."""
    key = await admitted(store)
    await store.claim(key, "w1", "w1", LEASE, 2)
    await store.advance(key, "w1", Status.DELIVERING, result="COMPLETED")
    verdicts = []
    for n in range(3):
        await asyncio.sleep(LEASE + 0.05)
        assert await store.requeue(key, "AGAIN", 5)
        claim = await store.claim(key, f"w{n + 2}", f"w{n + 2}", LEASE, 2)
        verdicts.append((claim.verdict, claim.record.deliveries, claim.record.result))
    assert verdicts == [
        (Verdict.DELIVERING, 1, "COMPLETED"),
        (Verdict.DELIVERING, 2, "COMPLETED"),
        (Verdict.EXHAUSTED, 3, "COMPLETED"),
    ]


async def test_a_repeated_claim_answers_as_the_first(store: RecordStore) -> None:
    """A claim run again after its reply was lost is not ``busy``."""
    key = await admitted(store)
    first = await store.claim(key, "w1:a", "w1", LEASE, 5)
    repeat = await store.claim(key, "w1:a", "w1", LEASE, 5)
    assert (
        (repeat.verdict, repeat.attempt) == (first.verdict, first.attempt) == (Verdict.RUNNING, 1)
    )
    assert (await store.claim(key, "w2:b", "w2", LEASE, 5)).verdict is Verdict.BUSY


async def test_renewal_reports_a_cancel_and_a_late_success_is_cancelled(
    store: RecordStore,
) -> None:
    """A stop message is only the fast path. Renewal reports the cancel request,
    and a success written after it is stored as the cancelled result instead."""
    key = await admitted(store)
    await store.claim(key, "w1", "w1", 3, 5)
    assert await store.cancel({key: ""}, RETAIN) == {key: CancelOutcome.CANCELLED_RUNNING}
    assert await store.renew({"w1": key}, 3, 60) == ([], ["w1"])
    moved = await store.advance(
        key, "w1", Status.SUCCESS, result="WON", cancelled_result="STOPPED", retention_seconds=60
    )
    assert moved is Advance.CANCELLED
    saved = await store.load(key)
    assert (saved.status, saved.result) == (Status.CANCELLED, "STOPPED")


async def test_a_cancel_of_a_delivering_rollout_answers_finished(store: RecordStore) -> None:
    """A delivering rollout has its result; a cancel neither stops nor marks it."""
    key = await admitted(store)
    await store.claim(key, "w1", "w1", 3, 5)
    await store.advance(key, "w1", Status.DELIVERING, result="COMPLETED")
    assert await store.cancel({key: ""}, RETAIN) == {key: CancelOutcome.FINISHED}
    assert (await store.load(key)).cancel_requested is False
    assert await store.renew({"w1": key}, 3, 60) == ([], [])


async def test_a_lost_message_behind_hundreds_of_long_running_ones_is_found(
    store: RecordStore, redis: Redis
) -> None:
    """With late acks the oldest taken messages are long-running rollouts: the sweeper
    reads every taken message, not the oldest 500, so one taken and never started behind 600
    of them is found (not left for the broker's visibility timeout)."""
    app = Celery("t")
    taken_at = time.time() - 60
    for n in range(600):
        key = await admitted(store, f"long-{n}")
        await store.claim(key, f"w{n}", "w", 60, 5)
        entry = json.dumps([json.loads(task_message(app, key, f"long-{n}", "q")), "", "q"])
        await redis.hset(UNACKED, f"tag-{n}", entry)
        await redis.zadd(UNACKED_INDEX, {f"tag-{n}": taken_at + n / 1000})
    lost = await admitted(store, "lost")
    entry = json.dumps([json.loads(task_message(app, lost, "lost", "q")), "", "q"])
    await redis.hset(UNACKED, "tag-lost", entry)
    await redis.zadd(UNACKED_INDEX, {"tag-lost": taken_at + 1})
    assert await store.stale_taken_messages(time.time() - 30, 500) == [("tag-lost", lost)]


async def gateway_admitted(store: RecordStore, record_id: str) -> RecordKey:
    """A v1 rollout admitted as a gateway admits one: its admission message is pushed to the
    back of the queue and its record names the message's task."""
    key = store.keys.record("v1", record_id)
    message, names = admission_message(Celery("t"), key, record_id, "q", {})
    assert (await store.admit_begin(key, "tok", 5)).start is AdmitStart.LEAD
    assert await store.admit_commit(key, "tok", 60, message, {**PROTOCOL, **names})
    return key


async def sent_to_check(redis: Redis, store: RecordStore) -> tuple[set[RecordKey], int]:
    """What one lost-message check finds, and how many bytes Redis sent while it ran."""
    before = int((await redis.info("stats"))["total_net_output_bytes"])
    found = await store.waiting_without_message()
    after = int((await redis.info("stats"))["total_net_output_bytes"])
    return found, after - before


async def test_the_lost_message_check_costs_the_same_behind_any_backlog(
    alone: tuple[RecordStore, Redis],
) -> None:
    """The check reads the queue's tail up to the oldest admission message, not the whole
    queue (v1's queue is unbounded): what Redis sends for a check is the same with
    100 rollouts waiting and with 3000, and the lost one is found either way."""
    store, redis = alone
    costs = []
    for backlog in (100, 3000):
        await redis.flushdb()
        lost = await gateway_admitted(store, "lost")
        for n in range(backlog):
            await gateway_admitted(store, f"waiting-{n}")
        assert await redis.rpop("q")  # a worker took the oldest message and died at once
        found, sent = await sent_to_check(redis, store)
        assert found == {lost}
        costs.append(sent)
    small, large = costs
    assert large < small + 5_000, f"a check sent {small} bytes behind 100, {large} behind 3000"


async def test_the_lost_message_check_costs_the_same_round_trips_with_any_number_running(
    alone: tuple[RecordStore, Redis],
) -> None:
    """The check asks one ZMSCORE which rollouts admitted before the queue's oldest admission
    hold a lease, not two commands for each rollout running: the commands a check sends are the same
    with 10 rollouts running and with 1000, and the lost one is found either way."""
    store, redis = alone
    costs = []
    for running in (10, 1000):
        await redis.flushdb()
        lost = await gateway_admitted(store, "lost")
        for n in range(running):
            key = await gateway_admitted(store, f"running-{n}")
            await store.claim(key, f"w:{n}", "w", 60, 5)
        await redis.delete("q")  # the running ones' messages were taken; lost's vanished
        await gateway_admitted(store, "waiting")  # the queue's oldest admission now
        counts = []
        for _ in range(3):  # the least of three: Redis counts any other client's too
            before = int((await redis.info("stats"))["total_commands_processed"])
            assert await store.waiting_without_message() == {lost}
            counts.append(int((await redis.info("stats"))["total_commands_processed"]) - before)
        costs.append(min(counts))
    few, many = costs
    assert many == few, f"a check ran {few} commands with 10 running, {many} with 1000"


async def test_front_pushes_are_read_and_only_rollouts_admitted_before_the_frontier_count(
    store: RecordStore, redis: Redis
) -> None:
    """The queue's tail holds messages pushed to the front (requeues, restores) before the
    admission messages: a rollout whose front message waits there is not lost, one whose
    front message was taken and vanished is, and rollouts admitted after the oldest admission
    message still queued are not even looked at."""
    keys = [await gateway_admitted(store, f"r{n}") for n in range(6)]
    for _ in range(4):  # r0..r3's admission messages taken; r4, r5 still queued
        assert await redis.rpop("q")
    await redis.rpush("q", task_message(Celery("t"), keys[0], "r0", "q"))  # r0 requeued
    entry = json.dumps([json.loads(task_message(Celery("t"), keys[1], "r1", "q")), "", "q"])
    await redis.hset(UNACKED, "tag-r1", entry)  # r1 taken, not started yet
    await store.claim(keys[2], "w", "w", 60, 5)  # r2 running; r3's message vanished
    assert await store.waiting_without_message() == {keys[3]}
    await redis.delete("q")  # r0's requeue message and r4, r5's admission messages vanish
    assert await store.waiting_without_message() == {keys[0], keys[3], keys[4], keys[5]}


async def test_a_long_front_part_skips_the_check_rather_than_read_the_backlog(
    store: RecordStore, redis: Redis
) -> None:
    """A mass requeue puts thousands of messages at the front: the check reads at most its
    page limit and judges nothing (a later check will), instead of reading them all."""
    lost = await gateway_admitted(store, "lost")
    await redis.delete("q")
    waiting = [await gateway_admitted(store, f"w{n}") for n in range(30)]
    for key in waiting:
        await redis.rpush("q", task_message(Celery("t"), key, "-", "q"))
    assert await store.waiting_without_message(limit=20) == set()
    assert await store.waiting_without_message(limit=40) == {lost}


async def test_only_v2_status_changes_are_published(store: RecordStore) -> None:
    """Changes are published for the long-polls waiting on them (P§2.4), and only v2 has
    long-polls: a v1 rollout's claim, delivery and end publish nothing (three commands per v1
    rollout that nobody would read). A v2 rollout's each wake its polls."""
    v1 = await admitted(store, "one")
    await v2_admit(store, "two", "d1")
    v2 = store.keys.record("v2", "two")
    async with store.changes() as changes:
        for key in (v1, v2):
            await store.claim(key, "w", "w", LEASE, 5)
        await store.advance(v1, "w", Status.DELIVERING, result="R")
        for key in (v1, v2):
            await store.advance(key, "w", Status.SUCCESS, result="R", retention_seconds=RETAIN)
        async with asyncio.timeout(5):  # in order: v1's claim came first
            seen = [await anext(changes) for _ in range(2)]
    assert [(c.key, c.status) for c in seen] == [(v2, Status.RUNNING), (v2, Status.SUCCESS)]


async def test_a_finished_record_keeps_no_secret(store: RecordStore, redis: Redis) -> None:
    """The sealed API key is there while the rollout runs, and emptied by its last write
    (in that write: no HDEL of its own); an empty one reads as none."""
    key = store.keys.record("v1", "sealed")
    assert (await store.admit_begin(key, "tok", 5)).start is AdmitStart.LEAD
    assert await store.admit_commit(key, "tok", 60, "MSG", {**PROTOCOL, RecordField.SECRET: "S"})
    assert (await store.claim(key, "w", "w", LEASE, 5)).record.secret == "S"
    await store.advance(key, "w", Status.FAILURE, result="R", retention_seconds=RETAIN)
    assert await redis.hget(key, RecordField.SECRET) == ""
    assert (await store.load(key)).secret is None


async def admitted_as(store: RecordStore, rollout_id: str, idempotency_key: str) -> RecordKey:
    """A v1 rollout admitted under an idempotency key other than its rollout id."""
    key = store.keys.record("v1", idempotency_key)
    assert (await store.admit_begin(key, "tok", 5)).start is AdmitStart.LEAD
    fields = {**PROTOCOL, RecordField.ROLLOUT_ID: rollout_id}
    assert await store.admit_commit(key, "tok", 60, "MSG", fields)
    return key


async def test_the_rollout_id_names_the_newest_admission_and_lives_as_long_as_its_record(
    store: RecordStore, redis: Redis
) -> None:
    older = await admitted_as(store, "r", "key-1")
    newer = await admitted_as(store, "r", "key-2")
    alias = store.keys.v1_alias("r")
    assert await redis.get(alias) == newer
    assert await store.keys_of("r", ["v1"]) == [store.keys.record("v1", "r"), newer]
    found = await store.find("r")
    assert found is not None
    assert found.rollout_id == "r"
    assert (await store.find("key-1")) is not None  # each key still finds its own

    await store.claim(older, "w1", "w1", 3, 5)  # the older one ends: the alias is not its
    await store.advance(older, "w1", Status.SUCCESS, result="R", retention_seconds=2)
    assert 59_000 < await redis.pttl(alias) <= 60_000

    await store.claim(newer, "w2", "w2", 3, 5)  # the newer one ends: the alias goes with it
    await store.advance(newer, "w2", Status.SUCCESS, result="R", retention_seconds=2)
    assert 1_000 < await redis.pttl(alias) <= 2_000
    assert abs(await redis.pttl(alias) - await redis.pttl(newer)) < 50


async def test_an_id_that_is_its_own_key_has_no_alias(store: RecordStore, redis: Redis) -> None:
    await admitted_as(store, "same", "same")
    assert await redis.exists(store.keys.v1_alias("same")) == 0


async def test_a_withdrawn_admission_takes_its_alias_along(
    store: RecordStore, redis: Redis
) -> None:
    key = await admitted_as(store, "r", "key-1")
    assert replies.flag(await store._run(Script.ADMIT_WITHDRAW, [key], ["tok"]))
    assert await redis.exists(key, store.keys.v1_alias("r")) == 0
    assert await store.find("r") is None


async def test_pruning_keeps_the_alias_of_a_long_rollout_alive_with_its_record(
    store: RecordStore, redis: Redis
) -> None:
    key = await admitted_as(store, "r", "key-1")
    await redis.zadd(store.keys.active, {key: 0})  # admitted long ago
    await redis.pexpire(store.keys.v1_alias("r"), 500)
    await store.prune(inflight_ttl_seconds=60)
    assert await redis.pttl(store.keys.v1_alias("r")) > 59_000
