"""Settings every process of one fleet must share (``FleetSettings.shared``): a gateway or
worker whose values differ from the live fleet's refuses to start, in one line naming each
setting, both values and the fix; once the whole fleet has stopped, new values start it over.
Before: a worker with a 1 s lease beside 15 s ones took a delivering rollout over after a Redis
outage (a second callback), and a worker keeping results 3 s beside a gateway promising a
120 s polling lease deleted them before the trainer's next poll (404)."""

from __future__ import annotations

import time

import pytest

from rollout_fleet.local import fleet_command
from rollout_fleet.processes import free_port, wait_until
from tests.conftest import StartFleet
from tests.harness import CALCULATOR_AGENT, assert_one_line, new_id, run_process

FIX = (
    "give every gateway and worker of one fleet the same values; to change them, stop the "
    "whole fleet first (its values lapse three leases after its last process stops)"
)


@pytest.mark.parametrize(
    ("command", "setting", "value", "fleets"),
    [
        ("worker", "ROLLOUT_FLEET_LEASE_SECONDS", "1", "3"),
        ("worker", "ROLLOUT_FLEET_RESULT_RETENTION_SECONDS", "200", "900"),
        ("gateway", "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS", "600", "120"),
    ],
)
def test_a_process_whose_shared_settings_differ_from_the_fleets_refuses_to_start(
    start_fleet: StartFleet, command: str, setting: str, value: str, fleets: str
) -> None:
    handle = start_fleet(workers=1)
    env = {**handle.fleet.process_env(), setting: value}
    listen = ["--host", "127.0.0.1", "--port", str(free_port())] if command == "gateway" else []
    result = run_process(fleet_command(command, *listen), env)
    key = handle.keys.shared_settings
    said = f"{setting}={value} here, {fleets} in the fleet's running processes ({key}): {FIX}"
    assert_one_line(result, f"refusing to start: {said}")


@pytest.mark.parametrize("command", ["gateway", "worker"])
def test_a_process_serving_another_agent_refuses_to_start(
    start_fleet: StartFleet, command: str
) -> None:
    """Before: a worker serving another agent joined silently and ran rollouts the gateways had
    admitted with this one's tools, ending them ``success``."""
    handle = start_fleet(workers=1)
    env = {**handle.fleet.process_env(), "AGENT": CALCULATOR_AGENT}
    listen = ["--host", "127.0.0.1", "--port", str(free_port())] if command == "gateway" else []
    result = run_process(fleet_command(command, *listen), env)
    key = handle.keys.shared_settings
    said = f"AGENT='calculator' here, 'scripted' in the fleet's running processes ({key})"
    assert_one_line(result, f"refusing to start: {said}: {FIX}")


@pytest.mark.parametrize("api_key", ["another-key", None])
def test_a_gateway_whose_api_key_differs_from_the_fleets_gateways_refuses_to_start(
    start_fleet: StartFleet, api_key: str | None
) -> None:
    """Another key, or none beside gateways that require one: before, such a replica admitted
    what the others refused. The refusal names the setting, never a key; workers, which need
    no key, start whatever theirs is."""
    handle = start_fleet(workers=0, env={"ROLLOUT_FLEET_API_KEY": "the-fleets-key"})
    env = {**handle.fleet.process_env()}
    env.pop("ROLLOUT_FLEET_API_KEY")
    if api_key is not None:
        env["ROLLOUT_FLEET_API_KEY"] = api_key
    listen = ["--host", "127.0.0.1", "--port", str(free_port())]
    result = run_process(fleet_command("gateway", *listen), env)
    key = handle.keys.gateway_settings
    said = f"ROLLOUT_FLEET_API_KEY is not the one the fleet's running gateways require ({key})"
    assert_one_line(result, f"refusing to start: {said}: {FIX}")
    assert "the-fleets-key" not in result.stdout + result.stderr
    assert "the-fleets-key" not in str(handle.redis.get(key))
    handle.fleet.start_worker(1, env)
    wait_until(lambda: handle.fleet.readiness().workers == 1, 60, "the worker")


def test_new_shared_settings_start_a_fleet_over_once_all_of_it_has_stopped(
    start_fleet: StartFleet,
) -> None:
    handle = start_fleet(workers=1)
    for process in handle.fleet.processes.values():
        process.stop()
    wait_until(lambda: not handle.redis.exists(handle.keys.shared_settings), 30, "lapse")
    env = {**handle.fleet.process_env(), "ROLLOUT_FLEET_LEASE_SECONDS": "2"}
    handle.fleet.start_gateway(env)
    handle.fleet.start_worker(1, env)
    wait_until(lambda: handle.fleet.readiness().workers == 1, 60, "the worker")
    rollout_id = new_id("over")
    assert handle.init(handle.body(rollout_id)).status_code == 202
    assert [c["status"] for c in handle.wait_delivered([rollout_id])[rollout_id]] == ["COMPLETED"]


def test_running_processes_store_the_settings_again_after_they_lapse_and_name_other_values(
    start_fleet: StartFleet,
) -> None:
    """A Redis outage longer than the shared settings' TTL lets them lapse while the fleet runs.
    Its live processes store them again at their next beat, so a process started after that
    with other values is still refused; one that started while they had lapsed is named by
    every live process, in one error line. Before: they only renewed the key's TTL, which does
    nothing to a missing key, and any later process became the fleet's values."""
    handle = start_fleet(workers=1)
    key = handle.keys.shared_settings
    stored = handle.redis.get(key)
    assert stored
    handle.redis.delete(key)  # as an outage past its TTL leaves it
    wait_until(lambda: handle.redis.get(key) == stored, 30, "the settings stored again")
    env = {**handle.fleet.process_env(), "ROLLOUT_FLEET_LEASE_SECONDS": "2"}
    result = run_process(fleet_command("worker"), env)
    said = f"ROLLOUT_FLEET_LEASE_SECONDS=2 here, 3 in the fleet's running processes ({key})"
    assert_one_line(result, f"refusing to start: {said}: {FIX}")
    other = stored.replace('_LEASE_SECONDS": 3.0', '_LEASE_SECONDS": 2.0')
    assert other != stored, stored
    handle.redis.delete(key)
    handle.redis.set(key, other, px=60_000)  # a process that started in the lapse
    said = (
        f"the fleet's shared settings are not this process's: ROLLOUT_FLEET_LEASE_SECONDS=3 "
        f"here, 2 in the fleet's running processes ({key})"
    )

    def told_by_all() -> bool:
        outputs = [process.output() for process in handle.fleet.processes.values()]
        return all(output.count(said) == 1 for output in outputs)

    wait_until(told_by_all, 30, "every process to name the other values")
    time.sleep(3)  # more beats: still one line each
    assert told_by_all()
