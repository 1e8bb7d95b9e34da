"""The secret key that seals what a trainer entrusts to a record, on real gateway and worker
processes: a rotated key list still opens what an old key sealed; a restarted worker opens
what the gateway sealed.

Following the warning of a fleet without ``ROLLOUT_FLEET_SECRET_KEY`` ("set it") on a fleet
with queued rollouts, on real gateway and worker processes. Before: the key the fleet had
generated (and kept in Redis) was dropped for the operator's own, so every rollout it had
sealed failed at its worker with an error naming the setting."""

from __future__ import annotations

from cryptography.fernet import Fernet

from tests.conftest import StartFleet
from tests.harness import admit_v1, new_id

SECRET_ENV = "ROLLOUT_FLEET_SECRET_KEY"
TRAINER_KEY = "sk-trainer-generated-key"


def test_rollouts_queued_under_the_generated_key_run_once_the_operator_sets_one(
    start_fleet: StartFleet,
) -> None:
    handle = start_fleet(workers=0, env={SECRET_ENV: ""})  # empty: unset, a key is generated
    queued = [new_id("queued") for _ in range(3)]
    for rollout_id in queued:
        response = handle.init(handle.body(rollout_id, api_key=TRAINER_KEY))
        assert response.status_code == 202, response.text
    assert "ROLLOUT_FLEET_SECRET_KEY is not set" in handle.fleet.processes["gateway"].output()

    # The operator follows the warning: gateway and workers restart with a key of their own.
    env = {**handle.fleet.process_env(), SECRET_ENV: Fernet.generate_key().decode()}
    handle.fleet.processes.pop("gateway").stop()
    handle.fleet.start_gateway(env)
    handle.fleet.start_worker(1, env)
    handle.fleet.wait_ready(60)
    after = new_id("after")
    assert handle.init(handle.body(after, api_key=TRAINER_KEY)).status_code == 202

    deliveries = handle.wait_delivered([*queued, after])
    for rollout_id in [*queued, after]:
        (callback,) = deliveries[rollout_id]
        assert callback["status"] == "COMPLETED", callback


def test_a_rotated_key_listed_new_old_still_opens_what_old_sealed(
    start_fleet: StartFleet,
) -> None:
    """A worker given ``NEW,OLD`` runs a rollout the gateway sealed with OLD (a record no key
    opens, and a worker with another key: ``tests/delivery/test_unreadable_records.py``)."""
    handle = start_fleet(workers=0)
    old = handle.fleet.process_env()[SECRET_ENV]
    rotated = new_id("rotated")
    new = Fernet.generate_key().decode()
    admit_v1(handle, rotated, api_key=TRAINER_KEY)
    env = handle.fleet.process_env()
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
    admit_v1(handle, rollout_id, api_key=TRAINER_KEY)
    assert handle.fleet.restart_dead_workers() == ["worker-1"]
    (callback,) = handle.wait_delivered([rollout_id])[rollout_id]
    assert callback["status"] == "COMPLETED"
