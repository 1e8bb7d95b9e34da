"""A user's own agent, in a folder of theirs outside the checkout, that imports a
package the images lack. The README's recipe builds an image on each of the fleet's with
that package, and compose runs them with the folder mounted read-only, as uid 10001."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.docker.stack import (
    Checkout,
    Stack,
    code_blocks,
    compose_project,
    readme_section,
    shell_commands,
    wait_for,
)
from tests.harness import REPO, admit_all, calculator_bodies

RECIPE = "* **An agent that needs more packages**"
# The bundled calculator, renamed with the extra package: /ready shows that it ran.
SERVER_HEADER = """import roman

"""
NAME = 'name = f"calculator-{roman.toRoman(16).lower()}"'


def recipe() -> tuple[str, list[str]]:
    """The README's Dockerfile and commands for an agent that needs more packages."""
    section = readme_section("### With Docker Compose")
    item = section[section.index(RECIPE) :].split("\n* ", 1)[0]
    (dockerfile,) = code_blocks(item, "dockerfile")
    (commands,) = code_blocks(item, "bash")
    return dockerfile, shell_commands(commands)


def write_agent(home: Path) -> Path:
    """``~/my_agent``: the calculator's files, its server importing ``roman``, and the
    README's Dockerfile; readable by others, as a folder made under umask 022 is."""
    folder = home / "my_agent"
    shutil.copytree(REPO / "examples/calculator", folder, ignore=shutil.ignore_patterns("__py*"))
    server = folder / "server.py"
    text = server.read_text().replace('    name = "calculator"', f"    {NAME}")
    assert NAME in text
    server.write_text(text.replace("import time\n", f"import time\n\n{SERVER_HEADER}", 1))
    (folder / "Dockerfile").write_text(recipe()[0])
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


@pytest.fixture(scope="module")
def stack(engine: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("compose")
    agent: dict[str, Path] = {}

    def make_agent(checkout: Checkout) -> None:
        agent["folder"] = write_agent(checkout.home)

    _, commands = recipe()
    # The one change to the README's commands: this engine's builds use the host's network
    # (scripts/docker-test-engine), as compose's do through tests/docker/compose.test.yml.
    commands = [c.replace("docker build ", "docker build --network host ", 1) for c in commands]
    settings = {
        "AGENT_DIR": str(folder / "home" / "my_agent"),
        "AGENT": "/agent/server.py:agent_loop",
        "TAG": "my-agent",
    }
    with compose_project(
        engine, folder, "test_compose_own_agent", ["cp .env.example .env", *commands], settings,
        before=make_agent,
    ) as running:  # fmt: skip
        yield running


def test_the_recipe_installs_into_the_images_venv_with_our_dockerfiles_uv() -> None:
    dockerfile, commands = recipe()
    uv = set(re.findall(r"ghcr\.io/astral-sh/uv:[\w.]+", dockerfile))
    ours = set(
        re.findall(r"ghcr\.io/astral-sh/uv:[\w.]+", (REPO / "Dockerfile.worker").read_text())
    )
    assert uv == ours  # the same uv image
    assert "uv pip install --python /app/.venv/bin/python" in dockerfile
    assert dockerfile.rstrip().endswith("USER 10001")  # back to the unprivileged user
    assert commands[-1] == "docker compose up -d --wait"  # no --build: it would replace them


def test_only_the_users_images_carry_the_package(stack: Stack) -> None:
    def imports_roman(image: str) -> None:
        stack.engine.containers.run(
            image, ["-c", "import roman"], entrypoint=["python"], network_mode="none", remove=True
        )

    for image in ("rollout-fleet-gateway", "rollout-fleet-worker"):
        with pytest.raises(docker.errors.ContainerError):
            imports_roman(f"{image}:latest")
        imports_roman(f"{image}:my-agent")
        built = stack.engine.images.get(f"{image}:my-agent")
        assert built.attrs["Config"]["User"] == "10001"
        base = stack.engine.images.get(f"{image}:latest")
        assert built.attrs["Size"] - base.attrs["Size"] < 1_000_000  # roman, not uv


def test_the_users_agent_runs_from_its_folder_read_only_as_uid_10001(stack: Stack) -> None:
    assert stack.trainer is not None
    ready = stack.ready()
    assert (ready["agent"], ready["workers"]) == ("calculator-xvi", 2)
    for service in ("gateway", "worker"):
        for container in stack.containers(service):
            assert container.attrs["Config"]["Image"] == f"rollout-fleet-{service}:my-agent"
            (mount,) = container.attrs["Mounts"]
            assert mount["Source"] == stack.setting("AGENT_DIR")
            assert (mount["Destination"], mount["RW"]) == ("/agent", False)
            code, output = container.exec_run(["id", "-u"])
            assert (code, output) == (0, b"10001\n")

    bodies = calculator_bodies(stack.trainer.url, 20)
    with stack.gateway() as gateway:
        admit_all(gateway, bodies)
    trainer = stack.trainer.client()
    ids = {body["rollout_id"] for body in bodies}
    wait_for(lambda: ids <= trainer.deliveries().keys(), 120, "every callback")
    deliveries: dict[str, list[dict[str, Any]]] = trainer.deliveries()
    for body in bodies:
        (done,) = deliveries[body["rollout_id"]]
        assert done["status"] == "COMPLETED"
        assert done["reward"] == (0.0 if body["metadata"]["ground_truth"] == "-1" else 1.0)


@pytest.mark.parametrize(
    ("image", "command"),
    [
        ("rollout-fleet-gateway", ["gateway", "--workers", "2"]),
        ("rollout-fleet-worker", ["worker"]),
    ],
)
def test_an_agent_folder_uid_10001_cannot_read_stops_the_process_saying_so(
    stack: Stack, tmp_path: Path, image: str, command: list[str]
) -> None:
    """Made under umask 077, the folder is the host user's alone: the process exits at once
    (the restart policy takes over) with one line that says what to do, never looping."""
    folder = tmp_path / "private_agent"
    shutil.copytree(REPO / "examples/calculator", folder, ignore=shutil.ignore_patterns("__py*"))
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    container = stack.engine.containers.run(
        f"{image}:latest",
        command,
        environment={
            "AGENT": "/agent/server.py:agent_loop",
            "ROLLOUT_FLEET_API_KEY": "key",
            "REDIS_URL": "redis://redis:6379/0",
        },
        volumes={str(folder): {"bind": "/agent", "mode": "ro"}},
        network_mode="none",
        detach=True,
    )
    try:
        exit_code = container.wait(timeout=60)["StatusCode"]
        output = container.logs().decode()
    finally:
        container.remove(force=True)
    assert exit_code != 0
    assert "Permission denied: '/agent/server.py'" in output, output
    assert "runs as uid 10001" in output
    assert "make /agent and its files readable by it" in output
    assert "chmod -R a+rX <folder>" in output
    assert "Traceback" not in output
