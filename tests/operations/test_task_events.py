"""Flower's view of the fleet's tasks, with the task events sent in batches.

A worker's task events (received, started, succeeded) go out every quarter second in one
``task-multi`` message instead of one publish each. Whatever reads them as Flower does
(Celery's event ``State``) must still see every rollout's task, named, with its rollout id
as its argument, succeeded — and the publishes must be far fewer than the events.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from celery.events.state import State

from tests.conftest import v2_fleet
from tests.harness import EventChannel, V2FleetUnderTest

fleet = v2_fleet(gateways=1, workers=1)
ROLLOUTS = 40


def test_every_rollout_shows_succeeded_from_batched_events(fleet: V2FleetUnderTest) -> None:
    with EventChannel(fleet) as channel, ThreadPoolExecutor(ROLLOUTS) as pool:
        results = list(pool.map(lambda _: fleet.run(), range(ROLLOUTS)))
    assert all(result["status"] == "success" for result in results)
    events = channel.events()
    state = State()
    for event in events:
        state.event({**event, "local_received": time.time()})  # what a receiver adds
    tasks = {task.args: task for _, task in state.itertasks()}
    for result in results:
        task = tasks[repr(result["rollout_id"])]  # the id only, never the request
        assert (task.name, task.state) == ("rollout.run", "SUCCESS")
        assert task.started is not None
        assert task.worker is not None
    types = [event["type"] for event in events if event.get("args") is not None]
    assert types.count("task-received") >= ROLLOUTS
    assert len(channel.messages) < len(events) / 5, (len(channel.messages), len(events))
