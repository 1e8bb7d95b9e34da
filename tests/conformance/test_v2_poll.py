"""CONFORMANCE §J — the result long-poll (P§2.4), admitted on one gateway, polled on another."""

from __future__ import annotations

import time

import pytest

from tests.conftest import v2_fleet
from tests.harness import LEASE_HEADER, TERMINAL, V2FleetUnderTest

fleet = v2_fleet()
narrow = v2_fleet(gateways=1, workers=1, concurrency=1)

WAIT = 2.0  # the v2 test fleets' result_wait_timeout_sec
ORDER = ["queued", "running", "grading", "terminal"]


@pytest.mark.parametrize("headers", [{}, {LEASE_HEADER: ""}])
def test_78_the_lease_header_is_required(fleet: V2FleetUnderTest, headers: dict[str, str]) -> None:
    rollout_id, _ = fleet.admitted()
    response = fleet.poller.get(f"/rollout/{rollout_id}/result", headers=headers)
    assert response.status_code == 422


def test_79_unknown_id_is_404(fleet: V2FleetUnderTest) -> None:
    response = fleet.poll("never-admitted-id", "some-token")
    assert response.status_code == 404
    assert response.json() == {"detail": "unknown rollout_id"}


def test_80_wrong_token_is_403_running_and_finished(fleet: V2FleetUnderTest) -> None:
    rollout_id, token = fleet.admitted(metadata={"script": [{"sleep": 1}]})
    wrong = fleet.poll(rollout_id, token[:-1] + ("A" if token[-1] != "A" else "B"))
    assert wrong.status_code == 403
    assert wrong.json() == {"detail": "invalid polling lease"}
    fleet.result(rollout_id, token)
    assert fleet.poll(rollout_id, "nope").status_code == 403


def test_81_a_quiet_poll_returns_the_status_after_the_wait(fleet: V2FleetUnderTest) -> None:
    rollout_id, token = fleet.admitted(metadata={"script": [{"sleep": 8}]})
    fleet.wait_status(rollout_id, {"running"})
    started = time.monotonic()
    response = fleet.poll(rollout_id, token)
    waited = time.monotonic() - started
    assert response.status_code == 200
    assert response.json() == {
        "rollout_id": rollout_id,
        "status": "running",
        "sample": None,
        "err_message": None,
        "err_category": None,
    }
    assert WAIT * 0.8 <= waited <= WAIT + 2  # it waited for a change that never came


def test_82_a_waiting_poll_wakes_on_the_status_change(fleet: V2FleetUnderTest) -> None:
    rollout_id, token = fleet.admitted(
        metadata={"script": [{"sleep": 0.5}], "grade": [{"sleep": 1.0}, {"reward": 1.0}]}
    )
    fleet.wait_status(rollout_id, {"running"})
    assert fleet.poll(rollout_id, token).json()["status"] == "grading"  # woke on running→grading
    assert fleet.poll(rollout_id, token).json()["status"] == "success"


def test_83_a_finished_result_is_returned_again_unchanged(fleet: V2FleetUnderTest) -> None:
    rollout_id, token = fleet.admitted()
    final = fleet.result(rollout_id, token)
    again = [fleet.poll(rollout_id, token) for _ in range(3)]
    assert all(r.status_code == 200 and r.json() == final for r in again)


def _rank(status: str) -> int:
    return ORDER.index("terminal" if status in TERMINAL else status)


def test_84_statuses_never_go_backwards(fleet: V2FleetUnderTest) -> None:
    rollout_id, token = fleet.admitted(
        metadata={"script": [{"sleep": 0.3}], "grade": [{"sleep": 0.3}, {"reward": 1.0}]}
    )
    seen = []
    while not seen or seen[-1] not in TERMINAL:
        seen.append(fleet.poll(rollout_id, token).json()["status"])
    ranks = [_rank(status) for status in seen]
    assert ranks == sorted(ranks), seen


def test_85_the_wire_sample_has_no_trajectory(fleet: V2FleetUnderTest) -> None:
    final = fleet.run()
    assert final["status"] == "success"
    assert "trajectory_messages" not in final["sample"]
    assert final["sample"].keys() == {
        "messages",
        "label",
        "reward",
        "remove_sample",
        "metrics",
        "extra_fields",
    }


def test_86_waiting_for_a_worker_is_queued_then_running(narrow: V2FleetUnderTest) -> None:
    busy = narrow.admitted(metadata={"script": [{"sleep": 3}]})
    narrow.wait_status(busy[0], {"running"})
    rollout_id, token = narrow.admitted(metadata={"script": [{"sleep": 1}]})
    assert narrow.poll(rollout_id, token).json()["status"] == "queued"
    statuses = set()
    while not statuses & TERMINAL:
        statuses.add(narrow.poll(rollout_id, token).json()["status"])
    assert "running" in statuses
    narrow.result(*busy)
