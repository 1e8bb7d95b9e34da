"""A v1 record a worker cannot read still ends with one callback, and a worker that could
read none of the fleet's records does not start.

Real processes: a redis-server, a gateway, Celery workers and the mock TrainGate. The test
admits rollouts, then, before any worker takes them, makes their records unreadable in Redis
(the sealed API key corrupted or sealed with another key, the stored request no longer a
valid request, or cut short) or damages the stored tools the worker hands the agent (the
worker faults carrying it). Each ends once, with one ERROR callback to its trainer saying why
and carrying no ``Authorization`` header (the key is what may not be readable); before, such
a rollout failed without a word to its trainer. A worker given another
``ROLLOUT_FLEET_SECRET_KEY`` than the gateway's refuses to start, in one line; so does a
gateway given another key than the live workers hold.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from cryptography.fernet import Fernet

from rollout_core.secrets import GATEWAY_KEY_DIFFERS, GATEWAY_KEY_NEW_TO_WORKERS, KEYS_DIFFER
from rollout_fleet.local import fleet_command
from rollout_fleet.processes import free_port, wait_until
from tests.conftest import StartFleet
from tests.harness import FleetUnderTest, admit_v1, assert_one_line, new_id, run_process

SECRET_ENV = "ROLLOUT_FLEET_SECRET_KEY"
TRAINER_KEY = "sk-trainer-unreadable"
SETTLE = 4.0  # after the callbacks: time for a repeat to show


def foreign_seal(fields: dict[str, str]) -> tuple[str, str]:
    return "secret", Fernet(Fernet.generate_key()).encrypt(TRAINER_KEY.encode()).decode()


def corrupt_seal(fields: dict[str, str]) -> tuple[str, str]:
    return "secret", fields["secret"][:-12] + "AAAAAAAAAAAA"


def invalid_request(fields: dict[str, str]) -> tuple[str, str]:
    request = json.loads(fields["request"])
    request["messages"] = "no longer a list"
    return "request", json.dumps(request)


def cut_short_request(fields: dict[str, str]) -> tuple[str, str]:
    return "request", fields["request"][: len(fields["request"]) // 2 + 40]


def damaged_tools(fields: dict[str, str]) -> tuple[str, str]:
    """The request reads, but the worker faults on the stored tools it hands the agent."""
    return "response", "{damaged"


SPOILERS: dict[str, Callable[[dict[str, str]], tuple[str, str]]] = {
    "sealed with another key": foreign_seal,
    "sealed part corrupted": corrupt_seal,
    "request no longer valid": invalid_request,
    "request cut short": cut_short_request,
    "worker faults on it": damaged_tools,
}
WHY = {
    "sealed with another key": "ROLLOUT_FLEET_SECRET_KEY",
    "sealed part corrupted": "ROLLOUT_FLEET_SECRET_KEY",
    "request no longer valid": "no longer parses",
    "request cut short": "no longer parses",
    "worker faults on it": "the worker failed carrying this rollout: JSONDecodeError",
}


def completed_calls(handle: FleetUnderTest, rollout_id: str) -> list[dict[str, Any]]:
    return handle.trainer.calls("completed", rollout_id)


def test_each_unreadable_record_ends_with_one_error_callback_without_authorization(
    start_fleet: StartFleet,
) -> None:
    handle = start_fleet(workers=0)
    ids = {how: new_id("unreadable") for how in SPOILERS}
    for how, rollout_id in ids.items():
        body = handle.body(rollout_id, api_key=TRAINER_KEY)
        assert handle.init(body).status_code == 202
        record = handle.record_key(rollout_id)
        field, value = SPOILERS[how](handle.record(rollout_id))
        handle.redis.hset(record, field, value)
    handle.fleet.start_worker(1)
    deadline = time.monotonic() + 60
    while any(not completed_calls(handle, r) for r in ids.values()):
        assert time.monotonic() < deadline, handle.logs()
        time.sleep(0.2)
    time.sleep(SETTLE)
    for how, rollout_id in ids.items():
        calls = completed_calls(handle, rollout_id)
        assert len(calls) == 1, (how, calls)
        (call,) = calls
        headers = {name.lower() for name in call["headers"]}
        assert "authorization" not in headers, how
        callback = call["body"]
        assert callback["status"] == "ERROR", (how, callback)
        assert WHY[how] in callback["error_message"], (how, callback)
        unreadable = how != "worker faults on it"
        assert unreadable == ("record cannot be read" in callback["error_message"]), how
        record = handle.record(rollout_id)
        assert (record["status"], record["delivery"]) == ("failure", "delivered"), (how, record)
        assert record["terminations"] == "1"
        assert TRAINER_KEY not in json.dumps([call, record]), how
        view = handle.http.get(f"/v1/rollouts/{rollout_id}").json()
        assert WHY[how] in view["error"], (how, view)
    assert handle.redis.zcard(handle.keys.leases) == 0


def test_a_worker_with_another_secret_key_than_the_gateways_refuses_to_start(
    start_fleet: StartFleet,
) -> None:
    """The gateway sealed the key canary as it started; a worker that cannot open it says so
    in one line naming the fix, and exits non-zero, before it takes any rollout."""
    handle = start_fleet(workers=0)
    rollout_id = new_id("waits")
    assert handle.init(handle.body(rollout_id, api_key=TRAINER_KEY)).status_code == 202
    env = {**handle.fleet.process_env(), SECRET_ENV: Fernet.generate_key().decode()}
    refusal = KEYS_DIFFER.format(key=handle.keys.key_canary)
    assert "set the same ROLLOUT_FLEET_SECRET_KEY on gateways and workers" in refusal
    result = run_process(fleet_command("worker"), env)
    assert_one_line(result, refusal)
    assert env[SECRET_ENV] not in result.stdout + result.stderr
    assert handle.record(rollout_id)["status"] == "queued"  # untouched: it waits for a worker


def test_a_gateway_with_another_key_than_the_live_workers_refuses_to_start(
    start_fleet: StartFleet,
) -> None:
    """Workers that opened the key canary are live: a gateway given another key would admit
    rollouts none of them can read, and would replace the canary so that they refuse to start
    again. It refuses, in one line naming the fix; the canary stays, and the fleet runs on."""
    handle = start_fleet(workers=1)
    canary = handle.redis.get(handle.keys.key_canary)
    env = {**handle.fleet.process_env(), SECRET_ENV: Fernet.generate_key().decode()}
    argv = fleet_command("gateway", "--host", "127.0.0.1", "--port", str(free_port()))
    result = run_process(argv, env)
    assert_one_line(result, GATEWAY_KEY_DIFFERS.format(key=handle.keys.key_canary, workers=1))
    assert env[SECRET_ENV] not in result.stdout + result.stderr
    assert handle.redis.get(handle.keys.key_canary) == canary
    rollout_id = new_id("still")
    admit_v1(handle, rollout_id, api_key=TRAINER_KEY)
    (callback,) = handle.wait_delivered([rollout_id])[rollout_id]
    assert callback["status"] == "COMPLETED"


def test_a_rotation_begun_at_a_gateway_refuses_until_every_live_worker_holds_the_new_key(
    start_fleet: StartFleet,
) -> None:
    """A gateway given ``NEW,OLD`` opens the canary (OLD) but would seal with NEW, which the
    live workers do not hold: it refuses, naming the order of a rotation, and the canary stays.
    Before: it started, sealed its rollouts with NEW (each failed unread) and replaced the canary,
    so no worker on OLD could start again. With the workers given NEW,OLD first, it starts."""
    handle = start_fleet(workers=1)
    canary = handle.redis.get(handle.keys.key_canary)
    old = handle.fleet.process_env()[SECRET_ENV]
    env = {**handle.fleet.process_env(), SECRET_ENV: f"{Fernet.generate_key().decode()},{old}"}
    argv = fleet_command("gateway", "--host", "127.0.0.1", "--port", str(free_port()))
    result = run_process(argv, env)
    assert_one_line(result, GATEWAY_KEY_NEW_TO_WORKERS.format(workers=1))
    assert handle.redis.get(handle.keys.key_canary) == canary
    (worker,) = [name for name in handle.fleet.processes if "worker" in name]
    handle.fleet.processes[worker].stop()
    handle.fleet.start_worker(2, env)
    wait_until(lambda: handle.fleet.readiness().workers == 1, 60, "the worker on NEW,OLD")
    handle.fleet.processes["gateway"].stop()
    handle.fleet.start_gateway(env)
    wait_until(lambda: handle.redis.get(handle.keys.key_canary) != canary, 60, "the new canary")
    rollout_id = new_id("rotated")
    admit_v1(handle, rollout_id, api_key=TRAINER_KEY)
    (callback,) = handle.wait_delivered([rollout_id])[rollout_id]
    assert callback["status"] == "COMPLETED"


def test_with_no_worker_live_a_gateway_on_a_new_key_starts_the_fleet_over(
    start_fleet: StartFleet,
) -> None:
    """No worker is live (a fleet restarted whole on a new key, such as a second
    ``rollout-fleet up`` on the same Redis): the gateway replaces the canary, saying so, and
    workers on the new key start and run its rollouts."""
    handle = start_fleet(workers=0)
    canary = handle.redis.get(handle.keys.key_canary)
    handle.fleet.processes["gateway"].stop()
    env = {**handle.fleet.process_env(), SECRET_ENV: Fernet.generate_key().decode()}
    handle.fleet.start_gateway(env)
    wait_until(
        lambda: handle.redis.get(handle.keys.key_canary) not in (None, canary), 60, "a new canary"
    )
    handle.fleet.start_worker(1, env)
    rollout_id = new_id("over")
    wait_until(lambda: handle.fleet.readiness().workers == 1, 60, "the worker")
    admit_v1(handle, rollout_id, api_key=TRAINER_KEY)
    (callback,) = handle.wait_delivered([rollout_id])[rollout_id]
    assert callback["status"] == "COMPLETED"
    assert "no worker is live: replaced with this gateway's" in handle.logs(tail=100_000)
