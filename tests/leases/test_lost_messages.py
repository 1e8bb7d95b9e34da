"""Lost messages on real workers: a message a worker took from the queue and lost is found
by the sweeper's check and resent, and the rollout runs once."""

from __future__ import annotations

from rollout_core.queue.envelope import read_queued
from rollout_core.settings import FleetSettings
from tests.conftest import StartFleet
from tests.harness import admit_v1, new_id, script


def test_a_message_lost_behind_a_backlog_is_resent_and_every_rollout_runs_once(
    start_fleet: StartFleet,
) -> None:
    """On real workers: the lost-message check now reads only the queue's tail (its
    cost no longer grows with the backlog; tests/test_store.py measures that). A message a
    worker took from the tail and lost, with a backlog behind it, is still found and resent."""
    handle = start_fleet(workers=1, concurrency=1)
    slow = new_id("slow")
    admit_v1(handle, slow, metadata=script({"sleep": 4}))
    handle.wait_status(slow, {"running"})
    backlog = [new_id("backlog") for _ in range(10)]
    for rollout_id in backlog:
        admit_v1(handle, rollout_id)
    queue: str = FleetSettings.model_fields["queue"].default
    taken = read_queued(str(handle.redis.rpop(queue)))  # a worker took it, and died
    assert taken is not None
    assert taken.record == handle.record_key(backlog[0])
    deliveries = handle.wait_delivered([slow, *backlog], timeout=120)
    assert {i: [c["status"] for c in deliveries[i]] for i in [slow, *backlog]} == {
        i: ["COMPLETED"] for i in [slow, *backlog]
    }
    resent = [i for i in backlog if handle.record(i).get("resent_at")]
    assert resent == [backlog[0]], resent
    assert handle.record(backlog[0])["attempt"] == "1"
