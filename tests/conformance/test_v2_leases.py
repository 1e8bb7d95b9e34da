"""CONFORMANCE §K (polling leases, P§2.7) and §L (retention and reuse, P§2.8), with a 3 s
polling lease and 3 s retention (the least a 3 s polling lease allows)."""

from __future__ import annotations

import time

from tests.conftest import v2_fleet
from tests.harness import V2FleetUnderTest

LEASE, RETENTION = 3.0, 3.0
short = v2_fleet(
    env={
        "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS": str(LEASE),
        "ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "1",
        "ROLLOUT_FLEET_RESULT_RETENTION_SECONDS": str(RETENTION),
    }
)
# The sweeper looks only once a minute: expiry can only be noticed by a poll.
sleepy_sweeper = v2_fleet(
    gateways=1,
    workers=1,
    env={
        "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS": str(LEASE),
        "ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "1",
        "ROLLOUT_FLEET_SWEEP_INTERVAL_SECONDS": "60",
    },
)
EXPIRED = {
    "status": "failure",
    "err_category": "lease_expired",
    "err_message": "polling lease expired",
}
CHATTY = {"script": [{"chats": [40, 0.25]}]}  # a chat call every 0.25 s for 10 s


def _outcome(body: dict[str, object]) -> dict[str, object]:
    return {key: body[key] for key in EXPIRED}


def test_87_and_88_an_unpolled_rollout_expires_and_stops_calling_the_llm(
    short: V2FleetUnderTest,
) -> None:
    rollout_id, token = short.admitted(metadata=CHATTY)
    record = short.wait_status(rollout_id, {"failure"}, timeout=LEASE + 10)
    expired_at = int(record["finished_at"]) / 1000
    assert _outcome(short.poll(rollout_id, token).json()) == EXPIRED
    assert short.poll(rollout_id, token).json()["sample"] is None
    time.sleep(max(0.0, expired_at + 2 - time.time()))
    calls = short.trainer.calls("chat", rollout_id)
    assert calls, "it never ran"
    assert max(call["at"] for call in calls) <= expired_at + 2  # stopped within 2 s
    assert len(calls) < 40


def test_89_polling_keeps_a_long_rollout_alive(short: V2FleetUnderTest) -> None:
    rollout_id, token = short.admitted(metadata={"script": [{"sleep": 3 * LEASE}]})
    final = short.result(rollout_id, token, timeout=60)  # a poll every second, for ~9 s
    assert final["status"] == "success"


def test_90_a_poll_after_the_deadline_finds_it_expired(sleepy_sweeper: V2FleetUnderTest) -> None:
    rollout_id, token = sleepy_sweeper.admitted(metadata={"script": [{"sleep": 30}]})
    sleepy_sweeper.wait_status(rollout_id, {"running"})
    time.sleep(LEASE + 0.5)
    assert sleepy_sweeper.record(rollout_id)["status"] == "running"  # nobody noticed yet
    assert _outcome(sleepy_sweeper.poll(rollout_id, token).json()) == EXPIRED


def test_91_a_late_result_does_not_overwrite_the_expiry(sleepy_sweeper: V2FleetUnderTest) -> None:
    # The workflow blocks its event loop past the deadline, so cancellation cannot reach
    # it; when it finally returns, its result must be discarded.
    fleet = sleepy_sweeper
    rollout_id, token = fleet.admitted(metadata={"script": [{"block": LEASE + 3}, {"chat": {}}]})
    fleet.wait_status(rollout_id, {"running"})
    time.sleep(LEASE + 0.5)
    assert _outcome(fleet.poll(rollout_id, token).json()) == EXPIRED
    time.sleep(4)  # the block is over: the workflow went on and finished (or was cancelled)
    assert _outcome(fleet.poll(rollout_id, token).json()) == EXPIRED
    assert fleet.record(rollout_id)["status"] == "failure"


def test_92_and_93_results_are_kept_for_the_retention_then_the_id_is_free(
    short: V2FleetUnderTest,
) -> None:
    rollout_id, token = short.admitted()
    final = short.result(rollout_id, token)
    assert final["status"] == "success"
    finished_at = int(short.record(rollout_id)["finished_at"]) / 1000
    time.sleep(max(0.0, finished_at + RETENTION * 0.5 - time.time()))
    assert short.poll(rollout_id, token).json() == final
    assert short.admit(short.body(rollout_id)).status_code == 409
    time.sleep(max(0.0, finished_at + RETENTION + 0.5 - time.time()))
    assert short.poll(rollout_id, token).status_code == 404

    again = short.admit(
        short.body(rollout_id, metadata={"script": [{"raise": ["ValueError", "new"]}]})
    )
    assert again.status_code == 202
    second = short.result(rollout_id, again.json()["polling_lease_token"])
    assert (second["status"], second["err_message"]) == ("failure", "new")
    assert short.poll(rollout_id, token).status_code == 403  # the old lease is gone
