"""CONFORMANCE §M — ``POST /rollout/cancel`` (P§2.5), plus: running
rollouts stop within 1 s, no worker process restarts, other rollouts are unaffected."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import v2_fleet
from tests.harness import V2FleetUnderTest, new_id

fleet = v2_fleet()
# One worker with one slot: rollouts behind a busy slot stay queued.
narrow = v2_fleet(gateways=1, workers=1, concurrency=1)

CHATTY = {"script": [{"chats": [60, 0.2]}]}  # a chat call every 0.2 s for 12 s
CANCELLED = {"status": "cancelled", "sample": None, "err_category": None}


def cancel(fleet: V2FleetUnderTest, **selector: Any) -> dict[str, str]:
    response = fleet.http.post("/rollout/cancel", json=selector)
    assert response.status_code == 200, response.text
    dispositions: dict[str, str] = response.json()["dispositions"]
    return dispositions


def last_call(fleet: V2FleetUnderTest, rollout_id: str) -> float:
    return max(call["at"] for call in fleet.trainer.calls("chat", rollout_id))


@pytest.mark.parametrize(
    "body", [{}, {"all": False}, {"ids": ["a"], "all": True}, {"ids": ["a"], "prefix": "x"}]
)
def test_94_exactly_one_selector(fleet: V2FleetUnderTest, body: dict[str, Any]) -> None:
    response = fleet.http.post("/rollout/cancel", json=body)
    assert response.status_code == 422
    assert response.json() == {"detail": "pass exactly one selector: ids, prefix, or all"}


def test_95_an_empty_id_list_is_a_selector(fleet: V2FleetUnderTest) -> None:
    assert cancel(fleet, ids=[]) == {}


def test_96_97_101_cancel_by_id(fleet: V2FleetUnderTest) -> None:
    running, token = fleet.admitted(metadata=CHATTY)
    finished, finished_token = fleet.admitted()
    fleet.result(finished, finished_token)
    deadline = time.monotonic() + 20
    while not fleet.trainer.calls("chat", running) and time.monotonic() < deadline:
        time.sleep(0.05)

    asked_at = time.time()
    assert cancel(fleet, ids=[running, "nope", finished]) == {
        running: "cancelled_running",
        "nope": "not_found",
        finished: "not_found",
    }
    final = fleet.result(running, token)
    assert {k: final[k] for k in CANCELLED} == CANCELLED
    assert final["err_message"] in ("cancelled", None)
    time.sleep(2)
    assert last_call(fleet, running) < asked_at + 1  # traffic stopped within 1 s (≤ 2 s)


def test_98_a_queued_rollout_never_runs(narrow: V2FleetUnderTest) -> None:
    busy = narrow.admitted(metadata={"script": [{"sleep": 2}]})
    narrow.wait_status(busy[0], {"running"})
    queued, token = narrow.admitted()
    assert cancel(narrow, ids=[queued]) == {queued: "cancelled_queued"}
    final = narrow.result(queued, token)
    assert {k: final[k] for k in CANCELLED} == CANCELLED
    narrow.result(*busy)
    time.sleep(0.5)  # the slot is free: had the queued message not been dropped, it ran now
    assert narrow.trainer.calls("chat", queued) == []
    assert narrow.record(queued)["attempt"] == "0"


def test_99_prefix_and_all_cancel_what_the_fleet_holds(narrow: V2FleetUnderTest) -> None:
    group = f"grp-{new_id()}-"
    running = narrow.admitted(rollout_id=f"{group}run", metadata=CHATTY)
    narrow.wait_status(running[0], {"running"})
    queued = narrow.admitted(rollout_id=f"{group}queued")
    other = narrow.admitted(rollout_id=f"other-{new_id()}", metadata=CHATTY)
    assert cancel(narrow, prefix=group) == {
        running[0]: "cancelled_running",
        queued[0]: "cancelled_queued",
    }
    for rollout_id, token in (running, queued):
        assert narrow.result(rollout_id, token)["status"] == "cancelled"

    # The prefix left `other` alone: it takes the freed slot, and `late` queues behind it.
    narrow.wait_status(other[0], {"running"})
    late = narrow.admitted(rollout_id=f"late-{new_id()}")
    everything = cancel(narrow, all=True)
    assert everything[other[0]] == "cancelled_running"
    assert everything[late[0]] == "cancelled_queued"
    assert everything[running[0]] == everything[queued[0]] == "not_found"  # finished, retained
    assert set(everything.values()) <= {"cancelled_queued", "cancelled_running", "not_found"}


def test_100_cancelling_twice_is_harmless(fleet: V2FleetUnderTest) -> None:
    rollout_id, token = fleet.admitted(metadata=CHATTY)
    fleet.wait_status(rollout_id, {"running"})
    first = cancel(fleet, ids=[rollout_id])[rollout_id]
    second = cancel(fleet, ids=[rollout_id])[rollout_id]
    assert first == "cancelled_running"
    assert second in ("cancelled_running", "not_found")
    assert fleet.result(rollout_id, token)["status"] == "cancelled"
    assert cancel(fleet, ids=[rollout_id]) == {rollout_id: "not_found"}


def test_cancelling_one_rollout_leaves_its_worker_and_neighbours_alone(
    fleet: V2FleetUnderTest,
) -> None:
    workers = {
        name: p.pid for name, p in fleet.fleet.processes.items() if name.startswith("worker")
    }
    neighbours = [fleet.admitted(metadata={"script": [{"chats": [6, 0.2]}]}) for _ in range(6)]
    victim, token = fleet.admitted(metadata=CHATTY)
    fleet.wait_status(victim, {"running"})
    cancel(fleet, ids=[victim])
    assert fleet.result(victim, token)["status"] == "cancelled"
    for rollout_id, neighbour_token in neighbours:
        final = fleet.result(rollout_id, neighbour_token)
        assert final["status"] == "success"
        assert len(fleet.trainer.calls("chat", rollout_id)) == 6
    assert all(fleet.fleet.processes[name].alive() for name in workers)
    assert {name: fleet.fleet.processes[name].pid for name in workers} == workers
