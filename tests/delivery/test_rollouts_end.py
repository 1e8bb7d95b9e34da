"""Every admitted rollout ends, with one result, on real
processes: gateways and Celery workers against a real redis-server and the mock TrainGate."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from celery import Celery
from cryptography.fernet import Fernet

from rollout_core.queue.envelope import read_queued
from rollout_core.settings import FleetSettings
from rollout_fleet.local import LocalFleet
from tests.conftest import TEST_ENV, V2_ENV, StartFleet
from tests.harness import (
    SCRIPTED_V2_AGENT,
    FleetUnderTest,
    V2FleetUnderTest,
    new_id,
    script,
    v2_body,
)
from tests.operations.test_operations import fleet_cli

SECRET_ENV = "ROLLOUT_FLEET_SECRET_KEY"
TRAINER_KEY = "sk-trainer-f02"
LEASE = float(TEST_ENV["ROLLOUT_FLEET_LEASE_SECONDS"])
SETTLE = 3 * LEASE + 2  # long enough for a lapsed lease to be swept and taken over


def admit(handle: FleetUnderTest, rollout_id: str, **fields: object) -> None:
    response = handle.init(handle.body(rollout_id, **fields))
    assert response.status_code == 202, response.text


def revoke(handle: FleetUnderTest, rollout_id: str) -> None:
    """What Flower's Revoke button sends."""
    app = Celery(broker=handle.fleet.redis_url)
    try:
        app.control.revoke(handle.record(rollout_id)["task"])
    finally:
        app.close()


def test_a_rollout_of_the_other_generation_ends_with_its_trainer_told(
    start_fleet: StartFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A v1 rollout taken by a worker whose agent speaks v2 (the agent changed while rollouts
    waited; two fleets on one database) fails once, with a callback saying why; before, the
    worker renewed the lease of an execution that no longer existed, forever."""
    v1 = start_fleet(workers=0)
    rollout_id = new_id("other")
    admit(v1, rollout_id)
    v2 = LocalFleet(
        agent=SCRIPTED_V2_AGENT,
        redis_url=v1.fleet.redis_url,
        workers=1,
        env={**TEST_ENV, **V2_ENV, SECRET_ENV: v1.fleet.process_env()[SECRET_ENV]},
        log_dir=tmp_path_factory.mktemp("v2-on-v1"),
    ).start()
    try:
        record = v1.wait_status(rollout_id, {"failure"}, timeout=30)
        (callback,) = v1.wait_delivered([rollout_id])[rollout_id]
        assert callback["status"] == "ERROR"
        assert "speaks v2" in callback["error_message"]
        assert record["attempt"] == "1"
        assert not v1.redis.zscore(f"{v1.prefix}:leases", v1.record_key(rollout_id))
    finally:
        v2.stop()


def test_a_record_sealed_with_another_key_fails_once_and_a_rotation_keeps_old_keys(
    start_fleet: StartFleet,
) -> None:
    """Gateways and workers with different ``ROLLOUT_FLEET_SECRET_KEY``: the rollout fails at
    its first attempt with an error naming the setting (before: the worker crashed on it,
    attempts went on past max_attempts until the record's TTL). A rotated key listed as
    ``NEW,OLD`` still opens what OLD sealed."""
    handle = start_fleet(workers=0, env={"ROLLOUT_FLEET_MAX_ATTEMPTS": "2"})
    old = handle.fleet.process_env()[SECRET_ENV]
    unreadable, rotated = new_id("sealed"), new_id("rotated")
    admit(handle, unreadable, api_key=TRAINER_KEY)
    env = handle.fleet.process_env()
    stranger = handle.fleet.start_worker(1, {**env, SECRET_ENV: Fernet.generate_key().decode()})
    try:
        record = handle.wait_status(unreadable, {"failure"}, timeout=30)
        assert record["attempt"] == "1"
        view = handle.http.get(f"/v1/rollouts/{unreadable}").json()
        assert "ROLLOUT_FLEET_SECRET_KEY" in view["error"]
        assert view["delivery"].startswith("not delivered")
        assert TRAINER_KEY not in str(view)
    finally:
        stranger.stop()
    new = Fernet.generate_key().decode()
    admit(handle, rotated, api_key=TRAINER_KEY)
    rotated_worker = handle.fleet.start_worker(2, {**env, SECRET_ENV: f"{new},{old}"})
    try:
        (callback,) = handle.wait_delivered([rotated])[rotated]
        assert callback["status"] == "COMPLETED"
    finally:
        rotated_worker.stop()


def test_a_worker_the_local_supervisor_restarts_opens_what_the_gateway_sealed(
    start_fleet: StartFleet,
) -> None:
    """Found by the nemesis schedule: ``LocalFleet`` (``rollout-fleet up``, the tests) gave a
    restarted worker a new generated secret key, so it could open nothing queued before."""
    handle = start_fleet(workers=1)
    handle.fleet.processes["worker-1"].kill()
    rollout_id = new_id("restarted")
    admit(handle, rollout_id, api_key=TRAINER_KEY)
    assert handle.fleet.restart_dead_workers() == ["worker-1"]
    (callback,) = handle.wait_delivered([rollout_id])[rollout_id]
    assert callback["status"] == "COMPLETED"


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
    admit(handle, rollout_id)
    handle.wait_status(rollout_id, {"delivering"}, timeout=30)
    deadline = time.monotonic() + 10
    while not handle.trainer.calls("completed", rollout_id) and time.monotonic() < deadline:
        time.sleep(0.05)  # the POST reached the trainer
    if how == "cancel":
        done = fleet_cli(handle, "cancel", rollout_id)
        assert done.returncode == 0, done.stderr
        assert f"{rollout_id}: finished" in done.stdout
    else:
        revoke(handle, rollout_id)
    assert handle.record(rollout_id)["status"] == "delivering"  # the cancel came mid-POST
    record = handle.wait_status(rollout_id, {"success"}, timeout=30)
    time.sleep(SETTLE)  # a repeat would come once the abandoned lease lapsed
    callbacks = handle.trainer.deliveries()[rollout_id]
    assert [c["status"] for c in callbacks] == ["COMPLETED"]
    assert len(handle.trainer.calls("completed", rollout_id)) == 1
    assert record["delivery"] == "delivered"
    assert handle.record(rollout_id)["terminations"] == "1"
    assert "cancel_requested" not in handle.record(rollout_id)


def test_every_callback_carries_its_admissions_idempotency_key(start_fleet: StartFleet) -> None:
    handle = start_fleet(workers=1)
    rollout_id, key = new_id("idem"), new_id("key")
    admit(handle, rollout_id, idempotency_key=key)
    handle.wait_delivered([rollout_id])
    (call,) = handle.trainer.calls("completed", rollout_id)
    token = handle.record(key)["admit_token"]
    assert {k.lower(): v for k, v in call["headers"].items()}["idempotency-key"] == token


def test_a_missed_stop_message_still_stops_the_rollout(start_fleet: StartFleet) -> None:
    """The cancel request is in the record but its stop message never reached the worker (its
    listener was reconnecting): the lease heartbeat sees it and the rollout ends cancelled,
    never ``success`` (before: it ran on and finished success with ``cancel_requested``)."""
    handle = start_fleet(SCRIPTED_V2_AGENT, workers=1, env=V2_ENV)
    rollout_id = new_id("missed")
    body = v2_body(handle.trainer.url, rollout_id, metadata=script({"sleep": 8}))
    response = handle.http.post("/rollout", json=body)
    assert response.status_code == 202, response.text
    key = f"{handle.prefix}:v2:{rollout_id}"
    deadline = time.monotonic() + 20
    while handle.redis.hget(key, "status") != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    handle.redis.hset(key, "cancel_requested", "1")  # requested; its stop message is lost
    started = time.monotonic()
    while handle.redis.hget(key, "status") not in {"success", "failure", "cancelled"}:
        assert time.monotonic() - started < 20, handle.logs()
        time.sleep(0.1)
    assert handle.redis.hget(key, "status") == "cancelled"


def test_a_delivery_taken_over_past_max_attempts_keeps_its_result(
    start_fleet: StartFleet,
) -> None:
    """The worker delivering a COMPLETED result dies mid-POST at the last allowed attempt; the
    next worker delivers that result again (a repeat inside the crash window), never an ERROR
    "exhausted" replacing a success the trainer may already have."""
    handle = start_fleet(workers=2, env={"ROLLOUT_FLEET_MAX_ATTEMPTS": "1"})
    rollout_id = new_id("last")
    handle.trainer.add_faults({"target": "completed", "delay_s": 5.0, "rollout_id": rollout_id})
    admit(handle, rollout_id)
    record = handle.wait_status(rollout_id, {"delivering"}, timeout=30)
    victim = next(
        p for n, p in handle.fleet.processes.items() if f":{p.pid}:" in record["execution"]
    )
    victim.kill()
    final = handle.wait_status(rollout_id, {"success", "failure"}, timeout=60)
    assert final["status"] == "success", final
    assert {c["status"] for c in handle.trainer.deliveries().get(rollout_id, [])} == {"COMPLETED"}
    assert final["terminations"] == "1"


def test_a_revoke_does_not_cancel_a_later_admission_of_the_same_id(
    start_fleet: StartFleet,
) -> None:
    """Flower's Revoke names a Celery task id, which workers remember for hours. Before, task
    ids were derived from the rollout, so the same id admitted again after its retention was
    cancelled at once."""
    env = {**V2_ENV, "ROLLOUT_FLEET_RESULT_RETENTION_SECONDS": "1"}
    handle = start_fleet(SCRIPTED_V2_AGENT, workers=1, env=env, handle=V2FleetUnderTest)
    assert isinstance(handle, V2FleetUnderTest)
    rollout_id = new_id("readmitted")
    first = handle.admitted(rollout_id=rollout_id, metadata=script({"sleep": 30}))
    handle.wait_status(rollout_id, {"running"})
    revoke(handle, rollout_id)
    assert handle.result(*first)["status"] == "cancelled"
    deadline = time.monotonic() + 20
    while handle.record(rollout_id) and time.monotonic() < deadline:
        time.sleep(0.2)  # its retention runs out: the id may be admitted again
    again = handle.admitted(rollout_id=rollout_id)
    assert handle.result(*again)["status"] == "success"


def test_a_message_lost_behind_a_backlog_is_resent_and_every_rollout_runs_once(
    start_fleet: StartFleet,
) -> None:
    """On real workers: the lost-message check now reads only the queue's tail (its
    cost no longer grows with the backlog; tests/test_store.py measures that). A message a
    worker took from the tail and lost, with a backlog behind it, is still found and resent."""
    handle = start_fleet(workers=1, concurrency=1)
    slow = new_id("slow")
    admit(handle, slow, metadata=script({"sleep": 4}))
    handle.wait_status(slow, {"running"})
    backlog = [new_id("backlog") for _ in range(10)]
    for rollout_id in backlog:
        admit(handle, rollout_id)
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
