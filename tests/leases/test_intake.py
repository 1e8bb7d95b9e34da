"""The worker takes its own messages on its event loop (``rollout_worker/intake.py``),
on a real fleet: Celery's consumer takes none, a worker holds no more messages than it runs,
a message that is not a rollout's is dropped without stopping the worker, and a stopping
worker takes nothing more, even once the hand-back frees its slots."""

from __future__ import annotations

import json
import time

from rollout_core.settings import FleetSettings
from tests.conftest import V2_ENV, StartFleet, v2_fleet
from tests.harness import SCRIPTED_V2_AGENT, V2FleetUnderTest

QUEUE: str = FleetSettings.model_fields["queue"].default
narrow = v2_fleet(gateways=1, workers=1, concurrency=2)


def test_a_worker_holds_only_the_messages_it_runs(narrow: V2FleetUnderTest) -> None:
    """Two slots: two rollouts run, four messages stay queued for other workers — had
    Celery's consumer kept consuming the queue, it would have taken its own prefetch."""
    admitted = [narrow.admitted(metadata={"script": [{"sleep": 3}]}) for _ in range(6)]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and narrow.redis.zcard(narrow.keys.leases) < 2:
        time.sleep(0.05)
    time.sleep(1.0)  # long enough for any other consumer to take messages
    statuses = [narrow.record(rollout_id)["status"] for rollout_id, _ in admitted]
    assert sorted(statuses) == ["queued"] * 4 + ["running"] * 2
    assert narrow.redis.llen(QUEUE) == 4
    for rollout_id, token in admitted:
        assert narrow.result(rollout_id, token)["status"] == "success"


def test_a_message_that_is_not_a_rollouts_is_dropped_and_the_worker_goes_on(
    narrow: V2FleetUnderTest,
) -> None:
    (worker,) = [p for name, p in narrow.fleet.processes.items() if name.startswith("worker")]
    pid = worker.pid
    narrow.redis.rpush(QUEUE, "not json", json.dumps({"headers": {"task": "other"}}))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and narrow.redis.llen(QUEUE):
        time.sleep(0.05)
    assert narrow.redis.llen(QUEUE) == 0
    assert narrow.run()["status"] == "success"
    assert worker.alive()
    assert worker.pid == pid
    assert "dropped a queued message that is not a rollout's" in narrow.logs()


def test_a_stopping_worker_with_every_slot_busy_takes_nothing_more(
    start_fleet: StartFleet,
) -> None:
    """One slot, busy; SIGTERM with a 1 s grace. The hand-back puts the running rollout back
    at the queue's front and frees the slot: a worker that went on taking would take that
    very message, claim it and hand it back a second time."""
    handle = start_fleet(
        SCRIPTED_V2_AGENT,
        handle=V2FleetUnderTest,
        gateways=1,
        workers=1,
        concurrency=1,
        env={**V2_ENV, "ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS": "1"},
    )
    assert isinstance(handle, V2FleetUnderTest)
    try:
        running, _ = handle.admitted(metadata={"script": [{"sleep": 60}]})
        queued, _ = handle.admitted()
        handle.wait_status(running, {"running"})
        (worker,) = [p for name, p in handle.fleet.processes.items() if name.startswith("worker")]
        assert worker.stop(grace=30) == 0
        first = handle.record(running)
        assert (first["status"], first["handoffs"], first["attempt"]) == ("queued", "1", "0")
        assert handle.record(queued)["status"] == "queued"
        assert "handoffs" not in handle.record(queued)
        assert handle.redis.llen(QUEUE) == 2
    finally:
        handle.close()
