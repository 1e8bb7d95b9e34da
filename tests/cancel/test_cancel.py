"""Cancel on real processes, whenever it comes: during a v1 admission, while the rollout runs
(its stop message lost), or while its result is on the wire; and cancel by prefix for any
id. The spec's own cancel items are in ``tests/conformance/test_v2_cancel.py``."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from tests.conftest import TEST_ENV, V2_ENV, StartFleet
from tests.harness import (
    SCRIPTED_V2_AGENT,
    V2FleetUnderTest,
    admit_v1,
    fleet_cli,
    new_id,
    script,
    v2_body,
)

LEASE = float(TEST_ENV["ROLLOUT_FLEET_LEASE_SECONDS"])
SETTLE = 3 * LEASE + 2  # long enough for a lapsed lease to be swept and taken over


@pytest.mark.parametrize("how", ["cancel", "revoke"])
def test_a_cancel_while_delivering_neither_cuts_the_post_nor_repeats_it(
    start_fleet: StartFleet, how: str
) -> None:
    """Cancel (the CLI, or Flower's Revoke) while the completion POST is on the wire: the
    POST is seen through, the cancel answers ``finished``, and the trainer hears once (before:
    the POST was cut, the record stayed ``delivering`` and another worker posted again)."""
    # The trainer holds the POST 15 s (the worker waits up to 25): the cancel, a CLI call of
    # a few seconds, lands mid-POST even on a loaded machine.
    handle = start_fleet(workers=2, env={"OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "25"})
    rollout_id = new_id(how)
    handle.trainer.add_faults({"target": "completed", "delay_s": 15.0, "rollout_id": rollout_id})
    admit_v1(handle, rollout_id)
    handle.wait_status(rollout_id, {"delivering"}, timeout=30)
    deadline = time.monotonic() + 10
    while not handle.trainer.calls("completed", rollout_id) and time.monotonic() < deadline:
        time.sleep(0.05)  # the POST reached the trainer
    if how == "cancel":
        done = fleet_cli(handle, "cancel", rollout_id)
        assert done.returncode == 0, done.stderr
        assert f"{rollout_id}: finished" in done.stdout
    else:
        handle.revoke(rollout_id)
    assert handle.record(rollout_id)["status"] == "delivering"  # the cancel came mid-POST
    record = handle.wait_status(rollout_id, {"success"}, timeout=30)
    time.sleep(SETTLE)  # a repeat would come once the abandoned lease lapsed
    callbacks = handle.trainer.deliveries()[rollout_id]
    assert [c["status"] for c in callbacks] == ["COMPLETED"]
    assert len(handle.trainer.calls("completed", rollout_id)) == 1
    assert record["delivery"] == "delivered"
    assert handle.record(rollout_id)["terminations"] == "1"
    assert "cancel_requested" not in handle.record(rollout_id)


def test_a_missed_stop_message_still_stops_the_rollout(start_fleet: StartFleet) -> None:
    """The cancel request is in the record but its stop message never reached the worker (its
    listener was reconnecting): the lease heartbeat sees it and the rollout ends cancelled,
    never ``success`` (before: it ran on and finished success with ``cancel_requested``)."""
    handle = start_fleet(SCRIPTED_V2_AGENT, workers=1, env=V2_ENV)
    rollout_id = new_id("missed")
    body = v2_body(handle.trainer.url, rollout_id, metadata=script({"sleep": 8}))
    response = handle.http.post("/rollout", json=body)
    assert response.status_code == 202, response.text
    key = handle.keys.record("v2", rollout_id)
    deadline = time.monotonic() + 20
    while handle.redis.hget(key, "status") != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    handle.redis.hset(key, "cancel_requested", "1")  # requested; its stop message is lost
    started = time.monotonic()
    while handle.redis.hget(key, "status") not in {"success", "failure", "cancelled"}:
        assert time.monotonic() - started < 20, handle.logs()
        time.sleep(0.1)
    assert handle.redis.hget(key, "status") == "cancelled"


def test_a_cancel_during_a_v1_admission_is_kept_and_ends_the_rollout_cancelled(
    start_fleet: StartFleet,
) -> None:
    """A cancel that arrives while the admission still runs get_tools is not lost: the
    admission commits with it, and the trainer hears once that the rollout was cancelled."""
    handle = start_fleet(workers=1, env={"ROLLOUT_FLEET_GET_TOOLS_TIMEOUT_SECONDS": "20"})
    try:
        rollout_id = new_id("admitting")
        body = handle.body(rollout_id, metadata={"get_tools": "hang", "hang_s": 6})
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            admission = pool.submit(handle.init, body)
            handle.wait_status(rollout_id, {"admitting"})
            done = fleet_cli(handle, "cancel", rollout_id)
            assert handle.record(rollout_id)["status"] == "admitting"  # still running get_tools
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"{rollout_id}: cancelled_queued" in done.stdout
            assert admission.result(60).status_code == 202
        delivered = handle.wait_delivered([rollout_id])[rollout_id]
        time.sleep(LEASE)  # a second callback would come within a lease
        delivered = handle.trainer.deliveries()[rollout_id]
        assert [d["status"] for d in delivered] == ["ERROR"]
        assert "cancelled" in delivered[0]["error_message"]
        assert handle.trainer.calls("chat", rollout_id) == []  # never ran
    finally:
        handle.close()


def test_cancel_by_prefix_reaches_ids_going_on_past_latin_1(start_fleet: StartFleet) -> None:
    handle = start_fleet(SCRIPTED_V2_AGENT, workers=0, env=V2_ENV, handle=V2FleetUnderTest)
    assert isinstance(handle, V2FleetUnderTest)
    group = f"grp-{new_id()}-"
    ids = [f"{group}a", f"{group}é", f"{group}Ā", f"{group}漢", f"{group}🙂"]
    for rollout_id in ids:
        handle.admitted(rollout_id=rollout_id)
    response = handle.http.post("/rollout/cancel", json={"prefix": group})
    assert response.status_code == 200, response.text
    assert response.json()["dispositions"] == dict.fromkeys(ids, "cancelled_queued")
