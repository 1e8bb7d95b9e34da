"""Sandboxed rollouts: Harbor trials on the fleet, one container per rollout, none leaked.

A real fleet (gateway, two workers, Redis) runs an upstream-shaped Harbor rollout folder
(``HarborBackend`` with the ``oracle`` agent, imported through the ``osmosis_ai`` alias) on
the Docker engine ``scripts/docker-test-engine`` runs. The task (bench/sandboxes.py: the
``sandboxes`` benchmark point runs it too): write the product of two numbers to a file; its
``tests/test.sh`` checks it. Every check reads the engine: containers, networks and volumes
carrying the fleet's labels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from bench.sandboxes import docker_host, write_rollout
from tests.conftest import V2_ENV, StartFleet
from tests.docker.stack import COMPOSE_PLUGIN
from tests.harness import V2FleetUnderTest

FLEET_LABEL = "org.rollout-fleet.fleet"
ROLLOUT_LABEL = "org.rollout-fleet.rollout"


@pytest.fixture(scope="module")
def docker_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Docker client config whose CLI has the compose plugin (Harbor runs `docker compose`)."""
    config = tmp_path_factory.mktemp("docker-config")
    (config / "cli-plugins").mkdir()
    (config / "cli-plugins" / "docker-compose").symlink_to(COMPOSE_PLUGIN)
    return config


def sandbox_env(engine: docker.DockerClient, docker_config: Path) -> dict[str, str]:
    """The workers reach the test engine, with the compose plugin."""
    return {**V2_ENV, "DOCKER_HOST": docker_host(), "DOCKER_CONFIG": str(docker_config)}


def fleet_label(fleet: V2FleetUnderTest) -> str:
    """``label=value`` of the fleet's sandboxes: its key prefix and deployment id."""
    deployment = fleet.redis.get(f"{fleet.prefix}:deployment")
    assert deployment, "the workers keep the fleet's deployment id"
    return f"{FLEET_LABEL}={fleet.prefix}@{deployment}"


def labelled(engine: docker.DockerClient, label: str) -> dict[str, list[str]]:
    """Names of the containers, networks and volumes with ``label`` (``k=v``)."""
    filters = {"label": label}
    return {
        "containers": [c.name for c in engine.containers.list(all=True, filters=filters)],
        "networks": [n.name for n in engine.networks.list(filters=filters)],
        "volumes": [v.name for v in engine.volumes.list(filters=filters)],
    }


def none_left(engine: docker.DockerClient, label: str, within: float) -> float:
    """Seconds until nothing carries ``label``; fails after ``within``."""
    started = time.monotonic()
    while True:
        found = labelled(engine, label)
        if not any(found.values()):
            return time.monotonic() - started
        if time.monotonic() - started > within:
            raise AssertionError(f"left behind after {within}s: {found}")
        time.sleep(0.5)


def project_objects(engine: docker.DockerClient, projects: set[str]) -> list[str]:
    """Everything of these Compose projects still on the engine (volumes included)."""
    left = []
    for project in projects:
        left += labelled(engine, f"com.docker.compose.project={project}")["containers"]
        left += labelled(engine, f"com.docker.compose.project={project}")["networks"]
        left += labelled(engine, f"com.docker.compose.project={project}")["volumes"]
    return left


@pytest.fixture(scope="module")
def oracle_fleet(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[V2FleetUnderTest]:
    main = write_rollout(tmp_path_factory.mktemp("oracle-rollout"), slots=4)
    handle = start_fleet(
        str(main),
        handle=V2FleetUnderTest,
        workers=2,
        concurrency=10,
        env=sandbox_env(engine, docker_config),
    )
    assert isinstance(handle, V2FleetUnderTest)
    yield handle
    handle.close()


def results(fleet: V2FleetUnderTest, admitted: list[tuple[str, str]]) -> dict[str, dict]:
    return {
        rollout_id: fleet.result(rollout_id, token, timeout=300) for rollout_id, token in admitted
    }


def test_twenty_oracle_rollouts_over_two_workers_succeed_and_leave_no_sandbox(
    oracle_fleet: V2FleetUnderTest, engine: docker.DockerClient
) -> None:
    ready = oracle_fleet.http.get("/ready").json()
    assert ready["agent"] == "harbor:oracle@multiply_task"
    assert ready["sandbox_slots"] == 8  # TrialQueue(n_concurrent=4) on each of two workers

    started = time.monotonic()
    admitted = [oracle_fleet.admitted() for _ in range(20)]
    done = results(oracle_fleet, admitted)
    took = time.monotonic() - started

    assert {r["status"] for r in done.values()} == {"success"}, done
    assert {r["sample"]["reward"] for r in done.values()} == {1.0}
    for result in done.values():
        metrics = result["sample"]["metrics"]
        assert {"environment_setup_sec", "agent_sec", "verifier_sec", "trial_sec"} <= set(metrics)
    workers = {oracle_fleet.record(rollout_id)["worker"] for rollout_id in done}
    assert len(workers) == 2, f"one worker ran every trial: {workers}"
    print(f"20 oracle trials on 2 workers in {took:.1f}s")
    # The backend removes each trial's sandbox as it ends: nothing waits for a sweep.
    assert none_left(engine, fleet_label(oracle_fleet), within=5) < 5


def test_a_sandbox_carries_its_owner_labels_and_a_cancel_removes_it_at_once(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    main = write_rollout(tmp_path_factory.mktemp("slow-rollout"), solve_seconds=60)
    fleet = start_fleet(
        str(main), handle=V2FleetUnderTest, workers=1, env=sandbox_env(engine, docker_config)
    )
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        rollout_id, token = fleet.admitted()
        label = f"{ROLLOUT_LABEL}={rollout_id}"
        deadline = time.monotonic() + 120
        while not (found := engine.containers.list(filters={"label": label})):
            assert time.monotonic() < deadline, f"no sandbox started\n{fleet.logs()}"
            time.sleep(0.5)
        (container,) = found
        labels = container.labels
        record = fleet.record(rollout_id)
        assert f"{FLEET_LABEL}={labels[FLEET_LABEL]}" == fleet_label(fleet)
        assert labels["org.rollout-fleet.record"] == fleet.record_key(rollout_id)
        assert labels["org.rollout-fleet.execution"] == record["execution"]
        project = labels["com.docker.compose.project"]

        cancelled_at = time.monotonic()
        answer = fleet.http.post("/rollout/cancel", json={"ids": [rollout_id]})
        assert answer.status_code == 200, answer.text
        assert fleet.result(rollout_id, token)["status"] == "cancelled"
        gone = none_left(engine, label, within=15)
        assert not project_objects(engine, {project})
        took = time.monotonic() - cancelled_at
        print(f"sandbox removed {took:.1f}s after the cancel ({gone:.1f}s after the result)")
    finally:
        fleet.close()


def test_a_worker_killed_mid_trial_leaves_no_sandbox_and_every_rollout_ends_once(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    main = write_rollout(tmp_path_factory.mktemp("kill-rollout"), solve_seconds=8)
    fleet = start_fleet(
        str(main), handle=V2FleetUnderTest, workers=2, env=sandbox_env(engine, docker_config)
    )
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        admitted = [fleet.admitted() for _ in range(6)]
        victim = fleet.fleet.processes["worker-1"]
        label = fleet_label(fleet)
        deadline = time.monotonic() + 120
        while True:  # until the victim runs a trial in a container
            running = engine.containers.list(filters={"label": label})
            executions = {c.labels["org.rollout-fleet.execution"] for c in running}
            if any(f":{victim.pid}:" in e for e in executions):
                break
            assert time.monotonic() < deadline, f"the victim ran no trial\n{fleet.logs()}"
            time.sleep(0.3)
        projects = {c.labels["com.docker.compose.project"] for c in running}
        victim.kill()

        done = results(fleet, admitted)
        finished = time.monotonic()
        failed = {i: r["err_message"] for i, r in done.items() if r["status"] != "success"}
        assert not failed, f"{failed}\n{fleet.logs(20000)}"
        for rollout_id in done:
            record = fleet.record(rollout_id)
            assert record["status"] == "success"
        lease = 3.0  # TEST_ENV's ROLLOUT_FLEET_LEASE_SECONDS
        took = none_left(engine, label, within=2 * lease + 2)
        assert not project_objects(engine, projects)
        after = time.monotonic() - finished
        print(f"orphaned sandboxes gone {after:.1f}s after the last result (waited {took:.1f}s)")
    finally:
        fleet.close()
