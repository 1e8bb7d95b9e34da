"""Sandboxed rollouts: Harbor trials on the fleet, one container per rollout, none leaked.

A real fleet (gateway, two workers, Redis) runs an upstream-shaped Harbor rollout folder
(``HarborBackend`` with the ``oracle`` agent, imported through the ``osmosis_ai`` alias) on
the Docker engine ``scripts/docker-test-engine`` runs. The task is written here: write the
product of two numbers to a file; its ``tests/test.sh`` checks it. Every check reads the
engine: containers, networks and volumes carrying the fleet's labels.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from bench.sandboxes import TASK_BASE, write_oracle_rollout, write_task
from rollout_fleet.processes import free_port, wait_until
from rollout_fleet.redis_server import RedisServer
from tests.conftest import V2_ENV, StartFleet
from tests.docker.harbor_folders import write_probe_rollout, write_template_rollout
from tests.docker.sandboxes import (
    FLEET_LABEL,
    ROLLOUT_LABEL,
    fleet_up,
    host_address,
    labelled,
    none_left,
    succeeded_rollouts,
)
from tests.docker.stack import Trainer, docker_host
from tests.harness import V2FleetUnderTest, fleet_cli, v2_body


def sandbox_env(engine: docker.DockerClient, docker_config: Path) -> dict[str, str]:
    """The workers reach the test engine, with the compose plugin."""
    return {**V2_ENV, "DOCKER_HOST": docker_host(), "DOCKER_CONFIG": str(docker_config)}


def fleet_label(fleet: V2FleetUnderTest) -> str:
    """``label=value`` of the fleet's sandboxes: its key prefix and deployment id."""
    deployment = fleet.redis.get(fleet.keys.deployment)
    assert deployment, "the workers keep the fleet's deployment id"
    return f"{FLEET_LABEL}={fleet.prefix}@{deployment}"


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
    main = write_oracle_rollout(tmp_path_factory.mktemp("oracle-rollout"), slots=4)
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
    running = 0
    while running == 0 and time.monotonic() - started < 60:  # the workers' next heartbeat
        running = oracle_fleet.http.get("/ready").json()["sandboxes"]
        time.sleep(0.2)
    assert 1 <= running <= 8
    done = results(oracle_fleet, admitted)
    took = time.monotonic() - started

    assert {r["status"] for r in done.values()} == {"success"}, done
    assert {r["sample"]["reward"] for r in done.values()} == {1.0}
    for result in done.values():
        metrics = result["sample"]["metrics"]
        assert {"environment_setup_sec", "agent_sec", "verifier_sec", "trial_sec"} <= set(metrics)
    status = fleet_cli(oracle_fleet, "status", "--json")
    assert status.returncode == 0, status.stderr
    figures = json.loads(status.stdout)
    assert (figures["workers"], figures["sandbox_slots"], figures["finished"]) == (2, 8, 20)
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
    main = write_oracle_rollout(tmp_path_factory.mktemp("slow-rollout"), solve_seconds=60)
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
    main = write_oracle_rollout(tmp_path_factory.mktemp("kill-rollout"), solve_seconds=8)
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


def test_the_workspace_template_shaped_folder_runs_workflow_and_grader_in_sandboxes(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("template") / "multiply-harbor-strands"
    main = write_template_rollout(folder)
    trainer = Trainer(host_address(), tmp_path_factory.mktemp("trainer") / "mock-trainer.log")
    env = {
        **sandbox_env(engine, docker_config),
        "ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK": "host",  # pip installs the workflow's packages
        "ROLLOUT_FLEET_ALLOWED_TRAINER_URLS": trainer.url,
    }
    fleet = start_fleet(str(main), handle=V2FleetUnderTest, workers=2, env=env)
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        # The mock answers 6 * 7 with the multiply tool, then "#### 42": the grader decides.
        labels = ["42"] * 4 + ["41"] * 2
        admitted = []
        for label in labels:
            body = v2_body(trainer.url, label=label)
            response = fleet.admit(body)
            assert response.status_code == 202, response.text
            admitted.append((body["rollout_id"], response.json()["polling_lease_token"]))
        done = results(fleet, admitted)
        failed = {i: r["err_message"] for i, r in done.items() if r["status"] != "success"}
        assert not failed, f"{failed}\n{fleet.logs(20000)}"
        rewards = [done[rollout_id]["sample"]["reward"] for rollout_id, _ in admitted]
        assert rewards == [1.0] * 4 + [0.0] * 2
        for rollout_id, _ in admitted:
            sample = done[rollout_id]["sample"]
            assert "verifier_sec" in sample["metrics"]
            assert any(m.get("role") == "assistant" for m in sample["messages"])
            # The workflow called the TrainGate from inside its sandbox.
            assert trainer.client().calls(rollout_id=rollout_id), rollout_id
        assert none_left(engine, fleet_label(fleet), within=5) < 5
        exported = fleet_cli(fleet, "export")
        assert exported.returncode == 0, exported.stderr
        lines = {line["rollout_id"]: line for line in map(json.loads, exported.stdout.splitlines())}
        for rollout_id, _ in admitted:  # the trajectory and the trial's phases, exported
            assert lines[rollout_id]["messages"] == done[rollout_id]["sample"]["messages"]
            assert lines[rollout_id]["usage"]["trial_sec"] > 0
    finally:
        fleet.close()
        trainer.stop()


PROBE = """
import json, socket, sys
def connects(host, port):
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False
print(json.dumps({name: connects(h, p) for name, (h, p) in json.loads(sys.argv[1]).items()}))
"""


@pytest.fixture
def metadata_address() -> Iterator[str]:
    """169.254.169.254 on this host's loopback, as a cloud's metadata address answers."""
    address = "169.254.169.254"
    added = subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=False)
    yield address
    if added.returncode == 0:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)


def listening(host: str) -> tuple[subprocess.Popen[bytes], int]:
    """An HTTP server on ``host`` (standing for any service there); its port."""
    port = free_port(host)
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", host]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return server, port
        assert time.monotonic() < deadline, f"nothing listens on {host}:{port}"
        time.sleep(0.1)


def test_a_sandbox_reaches_the_traingate_and_nothing_else(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
    metadata_address: str,
) -> None:
    host = host_address()
    redis = RedisServer(bind="0.0.0.0").start()  # a Redis any of this host's addresses reach
    gateway, gateway_port = listening("0.0.0.0")  # as a gateway bound to every address is
    metadata, metadata_port = listening(metadata_address)
    trainer = Trainer(host, tmp_path_factory.mktemp("trainer") / "mock-trainer.log")
    targets = {
        "redis": [host, redis.port],
        "gateway": [host, gateway_port],
        "metadata": [metadata_address, metadata_port],
    }
    try:
        # The check can fail: a container on an ordinary network reaches all three.
        network = engine.networks.create(f"probe-{secrets.token_hex(4)}")
        try:
            seen = engine.containers.run(
                TASK_BASE,
                ["python3", "-c", PROBE, json.dumps(targets)],
                network=network.name,
                remove=True,
            )
        finally:
            network.remove()
        assert json.loads(seen) == {"redis": True, "gateway": True, "metadata": True}

        main = write_probe_rollout(tmp_path_factory.mktemp("probe") / "probe-rollout")
        env = {
            **sandbox_env(engine, docker_config),
            "ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK": "host",
            "ROLLOUT_FLEET_ALLOWED_TRAINER_URLS": trainer.url,
        }
        fleet = start_fleet(str(main), handle=V2FleetUnderTest, workers=1, env=env)
        assert isinstance(fleet, V2FleetUnderTest)
        try:
            body = v2_body(trainer.url, metadata={"probe": targets})
            response = fleet.admit(body)
            assert response.status_code == 202, response.text
            token = response.json()["polling_lease_token"]
            result = fleet.result(body["rollout_id"], token, timeout=300)
            assert result["status"] == "success", f"{result}\n{fleet.logs(20000)}"
            metrics = result["sample"]["metrics"]
            assert metrics["reached_redis"] == 0.0
            assert metrics["reached_gateway"] == 0.0
            assert metrics["reached_metadata"] == 0.0
            # The TrainGate answered through the relay, and saw the rollout's own calls.
            assert result["sample"]["reward"] == 1.0
            assert trainer.client().calls(rollout_id=body["rollout_id"])
        finally:
            fleet.close()
    finally:
        trainer.stop()
        for server in (gateway, metadata):
            server.terminate()
            server.wait(10)
        redis.stop()


def test_up_runs_the_workspace_template_shaped_folder_unchanged(
    engine: docker.DockerClient, docker_config: Path, tmp_path: Path
) -> None:
    main = write_template_rollout(tmp_path / "multiply-harbor-strands")
    trainer = Trainer(host_address(), tmp_path / "mock-trainer.log")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(sandbox_env(engine, docker_config))
    env.update(
        {
            "ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK": "host",
            "ROLLOUT_FLEET_ALLOWED_TRAINER_URLS": trainer.url,
        }
    )
    try:
        with fleet_up(sys.executable, main, env, tmp_path, 180) as (gateway, log_path):
            done = succeeded_rollouts(
                engine, gateway, trainer.url, ["42", "41"], 300, log_path.read_text
            )
            rewards = [result["sample"]["reward"] for result in done]
            assert rewards == [1.0, 0.0]
    finally:
        trainer.stop()


def test_dataset_mode_and_a_per_rollout_task_pick_each_rollouts_task(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("dataset")
    write_task(folder / "tasks" / "right")
    wrong = write_task(folder / "tasks" / "wrong")
    (wrong / "solution" / "solve.sh").write_text("#!/bin/bash\necho 41 > /app/answer.txt\n")
    elsewhere = write_task(folder / "elsewhere")
    main = folder / "main.py"
    main.write_text(
        "from harbor.trial.queue import TrialQueue\n"
        "from osmosis_ai.rollout.backend.harbor import HarborBackend, TaskMode\n"
        f"backend = HarborBackend(orchestrator=TrialQueue(n_concurrent=3), "
        f"tasks_dir={str(folder / 'tasks')!r}, task_mode=TaskMode.DATASET, agent='oracle')\n"
    )
    env = {**sandbox_env(engine, docker_config), "ROLLOUT_FLEET_SANDBOX_TASK_ROOTS": str(elsewhere)}
    fleet = start_fleet(str(main), handle=V2FleetUnderTest, workers=1, env=env)
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        rows = {
            "right": {"harbor_task_id": "right"},
            "wrong": {"harbor_task_id": "wrong"},
            "path": {"harbor_task": str(elsewhere)},
            "none": {},
        }
        admitted = {name: fleet.admitted(metadata=metadata) for name, metadata in rows.items()}
        done = {name: fleet.result(*ids, timeout=300) for name, ids in admitted.items()}
        assert done["right"]["status"] == "success"
        assert done["right"]["sample"]["reward"] == 1.0
        assert done["wrong"]["status"] == "success"
        assert done["wrong"]["sample"]["reward"] == 0.0
        assert done["path"]["sample"]["reward"] == 1.0
        assert done["none"]["status"] == "failure"
        assert done["none"]["err_message"] == (
            "dataset mode needs metadata['harbor_task_id'] (a folder in tasks_dir) or "
            "metadata['harbor_task'] on every row"
        )
        assert done["none"]["err_category"] == "validation_error"
    finally:
        fleet.close()


def test_a_worker_frozen_past_its_lease_loses_its_sandbox_and_every_rollout_ends_once(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """SIGSTOP past the lease: the rollout runs again elsewhere, the frozen execution's sandbox
    is removed while it is still frozen, and after SIGCONT it can neither finish nor leave
    anything behind."""
    main = write_oracle_rollout(tmp_path_factory.mktemp("frozen-rollout"), solve_seconds=10)
    fleet = start_fleet(
        str(main), handle=V2FleetUnderTest, workers=2, env=sandbox_env(engine, docker_config)
    )
    assert isinstance(fleet, V2FleetUnderTest)
    victim = fleet.fleet.processes["worker-1"]
    try:
        admitted = [fleet.admitted() for _ in range(4)]
        label = fleet_label(fleet)
        deadline = time.monotonic() + 120
        while True:
            running = engine.containers.list(filters={"label": label})
            frozen = [
                c for c in running if f":{victim.pid}:" in c.labels["org.rollout-fleet.execution"]
            ]
            if frozen:
                break
            assert time.monotonic() < deadline, f"the victim ran no trial\n{fleet.logs()}"
            time.sleep(0.3)
        projects = {c.labels["com.docker.compose.project"] for c in frozen}
        victim.signal(signal.SIGSTOP)
        try:
            lease = 3.0  # TEST_ENV's ROLLOUT_FLEET_LEASE_SECONDS
            wait_until(lambda: not project_objects(engine, projects), 6 * lease + 10, "the janitor")
        finally:
            victim.signal(signal.SIGCONT)
        done = results(fleet, admitted)
        failed = {i: r["err_message"] for i, r in done.items() if r["status"] != "success"}
        assert not failed, f"{failed}\n{fleet.logs(20000)}"
        for rollout_id, token in admitted:  # every poll returns the one result
            again = fleet.poll(rollout_id, token).json()
            assert again == done[rollout_id]
        none_left(engine, label, within=2 * lease + 5)
    finally:
        fleet.close()
