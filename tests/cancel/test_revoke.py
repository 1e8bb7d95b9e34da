"""A Celery revoke — what Flower's Revoke button sends — cancels exactly that rollout's task,
running or queued, on v2 and v1 fleets, without touching the worker process or its
neighbours; Flower's events show a queued rollout revoked before it ran as revoked; and a
revoke never reaches a later admission of the same id."""

from __future__ import annotations

import time

from tests.conftest import V2_ENV, StartFleet, module_fleet, v2_fleet
from tests.harness import (
    SCRIPTED_V2_AGENT,
    EventChannel,
    FleetUnderTest,
    V2FleetUnderTest,
    new_id,
    script,
)

replicas = v2_fleet(env={"ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "30"})
v1_fleet = module_fleet(workers=1)


def test_a_revoke_cancels_one_v2_rollout_only(replicas: V2FleetUnderTest) -> None:
    workers = {n: p.pid for n, p in replicas.fleet.processes.items() if n.startswith("worker")}
    neighbours = [replicas.admitted(metadata={"script": [{"chats": [5, 0.3]}]}) for _ in range(4)]
    victim, token = replicas.admitted(metadata={"script": [{"chats": [60, 0.2]}]})
    replicas.wait_status(victim, {"running"})
    replicas.revoke(victim)
    final = replicas.result(victim, token)
    assert (final["status"], final["err_message"]) == ("cancelled", "cancelled")
    for rollout_id, neighbour_token in neighbours:
        assert replicas.result(rollout_id, neighbour_token)["status"] == "success"
    assert {n: replicas.fleet.processes[n].pid for n in workers} == workers
    assert all(replicas.fleet.processes[n].alive() for n in workers)


def test_a_revoked_v1_rollout_still_reports_back_once(v1_fleet: FleetUnderTest) -> None:
    body = v1_fleet.body(metadata=script({"chat": {}}, {"sleep": 30}, {"complete": {}}))
    assert v1_fleet.init(body).status_code == 202
    v1_fleet.wait_status(body["rollout_id"], {"running"})
    v1_fleet.revoke(body["rollout_id"])
    (delivered,) = v1_fleet.wait_delivered([body["rollout_id"]], timeout=20)[body["rollout_id"]]
    assert delivered["status"] == "ERROR"
    assert "cancelled" in delivered["error_message"]
    assert v1_fleet.wait_status(body["rollout_id"], {"failure"})["delivery"] == "delivered"


narrow_v2 = v2_fleet(gateways=1, workers=1, concurrency=1)
narrow_v1 = module_fleet(workers=1, concurrency=1)


def test_revoking_a_queued_v2_rollout_cancels_it(narrow_v2: V2FleetUnderTest) -> None:
    busy = narrow_v2.admitted(metadata={"script": [{"sleep": 2}]})
    narrow_v2.wait_status(busy[0], {"running"})
    queued, token = narrow_v2.admitted()
    narrow_v2.revoke(queued)
    final = narrow_v2.result(queued, token)
    assert final["status"] == "cancelled"
    assert narrow_v2.trainer.calls("chat", queued) == []


def test_revoking_a_queued_v1_rollout_reports_back_once(narrow_v1: FleetUnderTest) -> None:
    busy = narrow_v1.body(metadata=script({"sleep": 2}, {"complete": {}}))
    queued = narrow_v1.body()
    assert narrow_v1.init(busy).status_code == narrow_v1.init(queued).status_code == 202
    narrow_v1.revoke(queued["rollout_id"])
    deliveries = narrow_v1.wait_delivered([busy["rollout_id"], queued["rollout_id"]])
    (reported,) = deliveries[queued["rollout_id"]]
    assert reported["status"] == "ERROR"
    assert "cancelled" in reported["error_message"]
    assert narrow_v1.trainer.calls("chat", queued["rollout_id"]) == []


two_slots = v2_fleet(gateways=1, workers=1, concurrency=2)


def test_a_queued_rollout_revoked_shows_revoked(two_slots: V2FleetUnderTest) -> None:
    with EventChannel(two_slots) as channel:
        busy = [two_slots.admitted(metadata={"script": [{"sleep": 2}]}) for _ in range(2)]
        two_slots.wait_status(busy[0][0], {"running"})
        queued, token = two_slots.admitted()
        task_id = two_slots.record(queued)["task"]
        two_slots.revoke(queued)
        assert two_slots.result(queued, token)["status"] == "cancelled"
        for rollout_id, busy_token in busy:
            assert two_slots.result(rollout_id, busy_token)["status"] == "success"
    kinds = [event["type"] for event in channel.events() if event.get("uuid") == task_id]
    assert kinds == ["task-received", "task-revoked"]
    assert two_slots.trainer.calls("chat", queued) == []


def test_a_revoke_does_not_cancel_a_later_admission_of_the_same_id(
    start_fleet: StartFleet,
) -> None:
    """Flower's Revoke names a Celery task id, which workers remember for hours. Before, task
    ids were derived from the rollout, so the same id admitted again after its retention was
    cancelled at once."""
    env = {
        **V2_ENV,
        "ROLLOUT_FLEET_RESULT_RETENTION_SECONDS": "2",
        "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS": "2",
        "ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "1",
    }
    handle = start_fleet(SCRIPTED_V2_AGENT, workers=1, env=env, handle=V2FleetUnderTest)
    assert isinstance(handle, V2FleetUnderTest)
    rollout_id = new_id("readmitted")
    first = handle.admitted(rollout_id=rollout_id, metadata=script({"sleep": 30}))
    handle.wait_status(rollout_id, {"running"})
    handle.revoke(rollout_id)
    assert handle.result(*first)["status"] == "cancelled"
    deadline = time.monotonic() + 20
    while handle.record(rollout_id) and time.monotonic() < deadline:
        time.sleep(0.2)  # its retention runs out: the id may be admitted again
    again = handle.admitted(rollout_id=rollout_id)
    assert handle.result(*again)["status"] == "success"
