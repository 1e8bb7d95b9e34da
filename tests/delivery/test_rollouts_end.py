"""Every admitted rollout ends, with one result, on real
processes: gateways and Celery workers against a real redis-server and the mock TrainGate."""

from __future__ import annotations

import pytest

from rollout_fleet.local import LocalFleet
from rollout_fleet.processes import wait_until
from tests.conftest import TEST_ENV, V2_ENV, StartFleet
from tests.harness import SCRIPTED_V2_AGENT, admit_v1, new_id

SECRET_ENV = "ROLLOUT_FLEET_SECRET_KEY"


def test_a_rollout_of_the_other_generation_ends_with_its_trainer_told(
    start_fleet: StartFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A v1 rollout taken by a worker whose agent speaks v2 (the agent changed while rollouts
    waited: the v1 fleet stopped, a v2 one started on its database) fails once, with a callback
    saying why; before, the worker renewed the lease of an execution that no longer existed,
    forever."""
    v1 = start_fleet(workers=0)
    rollout_id = new_id("other")
    admit_v1(v1, rollout_id)
    for process in v1.fleet.processes.values():
        process.stop()
    wait_until(lambda: not v1.redis.exists(v1.keys.shared_settings), 30, "the fleet's lapse")
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
        assert not v1.redis.zscore(v1.keys.leases, v1.record_key(rollout_id))
    finally:
        v2.stop()


def test_every_callback_carries_its_admissions_idempotency_key(start_fleet: StartFleet) -> None:
    handle = start_fleet(workers=1)
    rollout_id, key = new_id("idem"), new_id("key")
    admit_v1(handle, rollout_id, idempotency_key=key)
    handle.wait_delivered([rollout_id])
    (call,) = handle.trainer.calls("completed", rollout_id)
    token = handle.record(key)["admit_token"]
    assert {k.lower(): v for k, v in call["headers"].items()}["idempotency-key"] == token


def test_a_delivery_taken_over_past_max_attempts_keeps_its_result(
    start_fleet: StartFleet,
) -> None:
    """The worker delivering a COMPLETED result dies mid-POST at the last allowed attempt; the
    next worker delivers that result again (a repeat inside the crash window), never an ERROR
    "exhausted" replacing a success the trainer may already have."""
    handle = start_fleet(workers=2, env={"ROLLOUT_FLEET_MAX_ATTEMPTS": "1"})
    rollout_id = new_id("last")
    handle.trainer.add_faults({"target": "completed", "delay_s": 5.0, "rollout_id": rollout_id})
    admit_v1(handle, rollout_id)
    record = handle.wait_status(rollout_id, {"delivering"}, timeout=30)
    victim = next(
        p for n, p in handle.fleet.processes.items() if f":{p.pid}:" in record["execution"]
    )
    victim.kill()
    final = handle.wait_status(rollout_id, {"success", "failure"}, timeout=60)
    assert final["status"] == "success", final
    assert {c["status"] for c in handle.trainer.deliveries().get(rollout_id, [])} == {"COMPLETED"}
    assert final["terminations"] == "1"
