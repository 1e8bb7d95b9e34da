"""A workflow's sandbox layer: the fleet's lock, fetched on the worker, built with no network.

* The workspace template's ``multiply-harbor-strands`` shape (a template task with no
  ``instruction.md``, the workflow's dependencies in its own ``pyproject.toml``: upstream's
  SDK with its ``strands`` extra and a plain package its workflow imports) runs unchanged
  through ``rollout-fleet up`` from a virtual environment holding the fleet and upstream
  ``osmosis-ai`` 0.3.8, with image builds given no network at all.
* A project whose dependencies cannot resolve against the lock's pins ends each rollout once,
  as a failure naming the conflict pip found, in its result and in the worker's log.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.docker.harbor_folders import write_template_rollout
from tests.docker.sandboxes import fleet_up, host_address, succeeded_rollouts
from tests.docker.stack import Trainer, docker_host
from tests.harness import V2FleetUnderTest, v2_body

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_VERSION = "0.3.8"
PYTHON_312 = ("/root/.pyenv/versions/3.12.1/bin/python3.12", "python3.12")
PLAIN = "cowsay>=6"  # a pure-Python package beside the SDK's, imported by the workflow


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=900, **kwargs)


@pytest.fixture(scope="module")
def beside_upstream() -> Path:
    """A venv with the fleet (the harbor and strands extras, at the lock's pins) and upstream
    ``osmosis-ai`` 0.3.8 installed beside it, as an upstream user's machine has both; made
    once per lock under ``test-output/``. Its ``bin/python``. 0.3.8 goes in without its
    dependencies: its command line pins typer<0.28, the fleet's typer>=0.29, and what counts
    here is its package on the path, which the fleet's alias must stand in for."""
    key = hashlib.sha256((REPO / "uv.lock").read_bytes()).hexdigest()[:16]
    home = REPO / "test-output" / "fleet-beside-upstream" / f"{UPSTREAM_VERSION}-{key}"
    if (home / ".ready").exists():
        return home / "bin" / "python"
    shutil.rmtree(home, ignore_errors=True)
    python = next(filter(None, map(shutil.which, PYTHON_312)), None)
    if python is None:
        pytest.skip("no Python 3.12 interpreter (upstream osmosis-ai needs Python >= 3.12)")
    made = _run(["uv", "venv", "--python", python, str(home)])
    assert made.returncode == 0, made.stderr
    pins = home / "lock.txt"
    exported = _run(
        ["uv", "export", "--frozen", "--no-dev", "--extra", "harbor", "--extra", "strands",
         "--no-emit-workspace",
         "--no-hashes", "--no-header", "--format", "requirements-txt", "-o", str(pins)],
        cwd=REPO,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    python = str(home / "bin" / "python")
    env = {**os.environ, "UV_HTTP_TIMEOUT": "120"}
    installed = _run(
        ["uv", "pip", "install", "--python", python, "-c", str(pins),
         "-e", f"{REPO}[harbor,strands]", "-e", str(REPO / "sdk")],
        env=env,
    )  # fmt: skip
    if installed.returncode == 0:
        installed = _run(
            ["uv", "pip", "install", "--python", python, "--no-deps",
             f"osmosis-ai=={UPSTREAM_VERSION}"],
            env=env,
        )  # fmt: skip
    if installed.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        pytest.fail(f"installing the venv failed:\n{installed.stderr}")
    (home / ".ready").write_text(installed.stderr)
    return home / "bin" / "python"


def _worker_logs(up_log: Path) -> str:
    """Every log of the run ``up`` wrote (it names their folder in its first lines)."""
    found = re.search(r"logs: (\S+)", up_log.read_text())
    assert found, up_log.read_text()
    return "".join(path.read_text(errors="replace") for path in Path(found.group(1)).glob("*.log"))


def test_up_runs_the_template_folder_unchanged_beside_upstream_with_no_build_network(
    engine: docker.DockerClient, docker_config: Path, tmp_path: Path, beside_upstream: Path
) -> None:
    main = write_template_rollout(tmp_path / "multiply-harbor-strands", dependencies=(PLAIN,))
    task = main.parent / "multiply_harbor_task"
    before = sorted(p.relative_to(main.parent) for p in main.parent.rglob("*"))
    trainer = Trainer(host_address(), tmp_path / "mock-trainer.log")
    sandbox_dir = tmp_path / "sandboxes"
    env = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env.update(
        {
            "DOCKER_HOST": docker_host(),
            "DOCKER_CONFIG": str(docker_config),
            "ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK": "none",
            "ROLLOUT_FLEET_SANDBOX_DIR": str(sandbox_dir),
            "ROLLOUT_FLEET_ALLOWED_TRAINER_URLS": trainer.url,
        }
    )
    try:
        with fleet_up(str(beside_upstream), main, env, tmp_path, 300) as (gateway, log_path):
            done = succeeded_rollouts(
                engine,
                gateway,
                trainer.url,
                ["42", "41", "42"],
                600,
                lambda: _worker_logs(log_path),
            )
            for result in done:  # the workflow called the TrainGate from inside its sandbox
                assert trainer.client().calls(rollout_id=result["rollout_id"]), result
            rewards = [result["sample"]["reward"] for result in done]
            assert rewards == [1.0, 0.0, 1.0]
            logs = _worker_logs(log_path)
            # The fleet's alias stood for the installed upstream package.
            said = log_path.read_text() + logs
            assert f"not to the installed osmosis-ai {UPSTREAM_VERSION}" in said
            built = re.search(
                r"\(with the workflow\) ready in ([0-9.]+)s: (\d+) wheels, ([0-9.]+) MB", logs
            )
            assert built, logs[-5000:]
            print(f"layer built in {built.group(1)}s, {built.group(2)} wheels, {built.group(3)} MB")
    finally:
        trainer.stop()
    # The user's folder is as it was written; no prepared copy holds a rollout's prompt.
    assert sorted(p.relative_to(main.parent) for p in main.parent.rglob("*")) == before
    assert not (task / "instruction.md").exists()
    for instruction in (sandbox_dir / "tasks").rglob("instruction.md"):
        assert "6 * 7" not in instruction.read_text(), instruction


UNRESOLVABLE = "mcp>=99"  # the lock pins mcp far below: no version can satisfy both


def test_a_project_that_does_not_resolve_against_the_lock_fails_each_rollout_once_naming_why(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    main = write_template_rollout(
        tmp_path_factory.mktemp("unresolvable") / "multiply-harbor-strands", (UNRESOLVABLE,)
    )
    trainer = Trainer(host_address(), tmp_path_factory.mktemp("trainer") / "mock-trainer.log")
    env = {
        **V2_ENV,
        "DOCKER_HOST": docker_host(),
        "DOCKER_CONFIG": str(docker_config),
        "ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK": "none",
        "ROLLOUT_FLEET_ALLOWED_TRAINER_URLS": trainer.url,
    }
    fleet = start_fleet(str(main), handle=V2FleetUnderTest, workers=1, env=env)
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        admitted = []
        for _ in range(2):
            body = v2_body(trainer.url)
            response = fleet.admit(body)
            assert response.status_code == 202, response.text
            admitted.append((body["rollout_id"], response.json()["polling_lease_token"]))
        for rollout_id, token in admitted:
            result = fleet.result(rollout_id, token, timeout=300)
            assert result["status"] == "failure", result
            assert result["err_category"] == "validation_error", result
            message = result["err_message"]
            assert message.startswith("the sandbox layer's packages do not resolve: "), message
            assert "the project asks mcp>=99" in message, message
            assert re.search(r"the fleet's lock pins mcp==\d", message), message
            assert message.endswith("(from pip)"), message
            assert "\n" not in message, message
            assert "Traceback" not in message, message
            assert fleet.poll(rollout_id, token).json() == result  # the one result
            record = fleet.record(rollout_id)
            assert record["status"] == "failure"
            assert not trainer.client().calls(rollout_id=rollout_id)
        logs = fleet.logs(200000)
        assert "the project asks mcp>=99" in logs
        assert "Traceback" not in logs, logs[-5000:]
    finally:
        fleet.close()
        trainer.stop()
