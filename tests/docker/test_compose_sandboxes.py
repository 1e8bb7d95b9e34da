"""Sandboxed rollouts under Docker Compose, as the README's section on them says: its commands
in a fresh checkout, its ``.env`` lines (``docker-compose.sandboxes.yml``: the gateway, workers
and Flower from Dockerfile.worker's ``sandboxes`` target), with the workers on this test
engine through the opt-in ``docker-compose.engine-socket.yml`` (the engine's socket and a
sandbox folder of this host, each at the same path in the workers) instead of an engine of
their own.

The agent is an upstream-shaped Harbor folder with the ``oracle`` agent whose trials have
Harbor bind-mount their log folders from the sandbox folder: the engine resolves those paths
on its own host, so a worker that kept the folder at another path than the host's would fail
every rollout (the verifier's reward would never reach it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from bench.sandboxes import write_oracle_rollout
from rollout_core.store.schema import Keys
from tests.docker.sandboxes import FLEET_LABEL, none_left
from tests.docker.stack import (
    Stack,
    code_blocks,
    compose_project,
    docker_host,
    readme_section,
    shell_commands,
)
from tests.harness import LEASE_HEADER, TERMINAL, v2_body

HEADING = "### Sandboxed rollouts with Docker Compose"
PROJECT = "rollout-fleet-sandboxes"  # apart from the stacks of the other compose tests
SOCKET_OVERRIDE = "docker-compose.engine-socket.yml"
IMAGE = "rollout-fleet-sandboxes:latest"
ROLLOUTS = 6
WORKER_UID = 10001


def readme_instructions() -> tuple[list[str], dict[str, str]]:
    """The section's commands, and the ``.env`` lines it tells a user to set."""
    section = readme_section(HEADING)
    (commands,) = code_blocks(section, "bash")
    (lines,) = code_blocks(section, "dotenv")
    settings = dict(line.split("=", 1) for line in shell_commands(lines))
    return shell_commands(commands), settings


def readable_by_others(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture(scope="module")
def sandbox_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this host, the workers' own (uid 10001), seen by them at the same path."""
    folder = tmp_path_factory.mktemp("sandbox-dir") / "sandboxes"
    folder.mkdir()
    os.chown(folder, WORKER_UID, WORKER_UID)
    return folder


@pytest.fixture(scope="module")
def stack(
    engine: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory, sandbox_dir: Path
) -> Iterator[Stack]:
    commands, readme = readme_instructions()
    host = docker_host()
    if not host.startswith("unix://"):
        pytest.skip(f"{SOCKET_OVERRIDE} mounts the engine's socket; DOCKER_HOST is {host}")
    socket = host.removeprefix("unix://")
    folder = tmp_path_factory.mktemp("compose")
    agent = folder / "harbor-rollout"
    write_oracle_rollout(agent, slots=2, mounts=True)
    readable_by_others(agent)
    settings = {
        **readme,
        # This engine, through the opt-in override, instead of one of the sandboxes' own.
        "COMPOSE_FILE": f"{readme['COMPOSE_FILE']}{os.pathsep}{SOCKET_OVERRIDE}",
        "SANDBOX_DOCKER_HOST": host,
        "SANDBOX_DOCKER_TLS_VERIFY": "",
        "SANDBOX_DOCKER_SOCKET": socket,
        "SANDBOX_DOCKER_SOCKET_GID": str(os.stat(socket).st_gid),
        "SANDBOX_DIR": str(sandbox_dir),
        "AGENT_DIR": str(agent),
    }
    with compose_project(
        engine, folder, "test_compose_sandboxes", commands, settings, project=PROJECT
    ) as running:
        yield running


def environment(stack: Stack, service: str) -> dict[str, str]:
    container = stack.containers(service)[0]
    pairs = (entry.split("=", 1) for entry in container.attrs["Config"]["Env"])
    return {name: value for name, value in pairs}


def test_the_readme_sets_the_sandbox_files_and_an_engine_of_their_own() -> None:
    commands, settings = readme_instructions()
    assert commands[0] == "cp .env.example .env"
    assert commands[-1] == "docker compose up -d --build --wait"
    assert settings["COMPOSE_FILE"] == "docker-compose.yml:docker-compose.sandboxes.yml"
    assert settings["SANDBOX_DOCKER_HOST"].startswith("tcp://")  # not this host's socket
    assert settings["SANDBOX_DOCKER_TLS_VERIFY"] == "1"


def test_only_the_workers_reach_the_engine_and_see_the_sandbox_folder_at_its_path(
    stack: Stack, sandbox_dir: Path
) -> None:
    socket = stack.setting("SANDBOX_DOCKER_SOCKET")
    for service in ("gateway", "worker", "flower"):
        for container in stack.containers(service):
            assert container.attrs["Config"]["Image"] == IMAGE
            mounts = {m["Source"]: m["Destination"] for m in container.attrs["Mounts"]}
            env = environment(stack, service)
            if service == "worker":
                assert mounts[socket] == socket
                assert mounts[str(sandbox_dir)] == str(sandbox_dir)
                assert env["DOCKER_HOST"] == f"unix://{socket}"
                assert env["ROLLOUT_FLEET_SANDBOX_DIR"] == str(sandbox_dir)
            else:
                assert socket not in mounts
                assert str(sandbox_dir) not in mounts
                assert "DOCKER_HOST" not in env


def test_sandboxed_rollouts_through_the_gateway_succeed_and_leave_no_sandbox(
    stack: Stack, engine: docker.DockerClient, sandbox_dir: Path
) -> None:
    assert stack.trainer is not None
    ready = stack.ready()
    assert (ready["protocol"], ready["agent"], ready["workers"]) == (
        "v2",
        "harbor:oracle@multiply_task",
        2,
    )
    assert ready["sandbox_slots"] == 4  # TrialQueue(n_concurrent=2) on each of two workers

    started = time.monotonic()
    admitted: dict[str, str] = {}
    with stack.gateway() as gateway:
        for _ in range(ROLLOUTS):
            body = v2_body(stack.trainer.url)
            response = gateway.post("/rollout", json=body)
            assert response.status_code == 202, response.text
            admitted[body["rollout_id"]] = response.json()["polling_lease_token"]
        done: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 300
        while len(done) < ROLLOUTS:
            assert time.monotonic() < deadline, f"unfinished: {set(admitted) - set(done)}"
            for rollout_id, token in admitted.items():
                if rollout_id in done:
                    continue
                answer = gateway.get(f"/rollout/{rollout_id}/result", headers={LEASE_HEADER: token})
                assert answer.status_code == 200, answer.text
                if answer.json()["status"] in TERMINAL:
                    done[rollout_id] = answer.json()
    took = time.monotonic() - started

    failed = {i: r.get("err_message") for i, r in done.items() if r["status"] != "success"}
    assert not failed, f"{failed}\n{stack.logs('worker')[-20000:]}"
    assert {r["sample"]["reward"] for r in done.values()} == {1.0}
    for record in stack.records("v2", list(done)):
        assert (record["status"], record["terminations"]) == ("success", "1")
        assert record["container"].startswith(f"{PROJECT}-worker-")
    print(f"up --build --wait {stack.up_seconds:.1f}s; {ROLLOUTS} rollouts in {took:.1f}s")

    # The worker prepared the task in the sandbox folder, at this host's path; each successful
    # trial's folder is gone with its sandbox.
    assert list(sandbox_dir.glob("tasks/*/multiply_task/task.toml"))
    assert not list((sandbox_dir / "trials").iterdir())
    deployment = stack.redis().get(Keys("rf").deployment)
    assert deployment
    assert none_left(engine, f"{FLEET_LABEL}=rf@{deployment}", within=5) < 5
