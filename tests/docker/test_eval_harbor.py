"""``rollout-fleet eval run`` on the workspace template's Harbor folder, unchanged.

A workspace shaped like the template's (``rollouts/multiply-harbor-strands/``, its eval TOML,
``data/multiply.jsonl``) is evaluated end to end: the command starts a fleet of its own, every
row is a Harbor trial in a sandbox on the test engine, and the Strands workflow inside calls
the run's model bridge through the sandbox's egress relay; the bridge forwards to the model
endpoint, here the mock TrainGate's calculator (on loopback: only the bridge calls it). One of
the four rows carries a wrong ground truth, so the rewards are known beforehand. Then
``rollout-sdk eval run`` runs two of the rows in one process, in sandboxes just the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from rollout_fleet.local import fleet_command
from rollout_sdk.evaluation.results import RESULTS_FILE
from tests.docker.harbor_folders import write_template_workspace
from tests.docker.sandboxes import ROLLOUT_LABEL, host_address
from tests.docker.stack import docker_host
from tests.harness import REPO, MockTrainGateClient

QUESTIONS = [("12 * 8", "96"), ("7 * 6", "42"), ("13 * 11", "143"), ("9 * 9", "80")]
REWARDS = [1.0, 1.0, 1.0, 0.0]  # 9 * 9 is 81: the last row's ground truth is wrong
MODEL_KEY = "sk-model-endpoint-key"  # the model endpoint's key: only the bridge holds it


def eval_env(docker_config: Path) -> dict[str, str]:
    return {
        **os.environ,
        "COLUMNS": "200",
        "DOCKER_HOST": docker_host(),
        "DOCKER_CONFIG": str(docker_config),
        "ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK": "host",  # pip installs the workflow's packages
        "OPENAI_API_KEY": MODEL_KEY,  # the template's [secrets] asks for it
        # A state directory of its own: no `rollout-fleet up` running here is reused.
        "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="eval-harbor-state-"),
    }


def run_eval(
    config: Path, env: dict[str, str], *args: str, cli: str = "fleet"
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rollout_sdk.cli"] if cli == "sdk" else fleet_command()
    return subprocess.run(
        [*command, "eval", "run", str(config), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=REPO,
        env=env,
    )


def results_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / RESULTS_FILE).read_text().splitlines()]


def test_eval_run_on_the_template_harbor_folder_runs_each_row_in_a_sandbox(
    engine: docker.DockerClient,
    docker_config: Path,
    mock_trainer: MockTrainGateClient,
    tmp_path: Path,
) -> None:
    config = write_template_workspace(tmp_path / "workspace", QUESTIONS)
    model = f"{mock_trainer.url}/v1/rollouts/harbor-eval-model"
    runs = tmp_path / "runs"
    started = time.monotonic()
    run = run_eval(
        config, eval_env(docker_config), "--base-url", model, "-o", str(runs), "--name", "t", "-q"
    )
    on_fleet = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Traceback" not in output
    # The bridge listens where the sandboxes reach this host, and nowhere else.
    assert f"model bridge on http://{host_address()}:" in output, output

    results = sorted(results_of(runs / "t"), key=lambda result: result["row"])
    assert [r["status"] for r in results] == ["success"] * 4, results
    assert [r["reward"] for r in results] == REWARDS
    assert [r["passed"] for r in results] == [reward == 1.0 for reward in REWARDS]
    assert [r["label"] for r in results] == [truth for _, truth in QUESTIONS]
    assert all(r["llm_calls"] >= 2 for r in results), results  # the tool call, the answer
    policy = json.loads((runs / "t" / "metrics.json").read_text())["models"]["policy"]
    assert (policy["finished"], policy["succeeded"], policy["failed"]) == (4, 4, 0)
    assert policy["mean_reward"] == pytest.approx(0.75)

    # Every model call came from a sandbox through the bridge, which sent the model endpoint's
    # own key and the TOML's model; the rollouts only ever held the bridge's key.
    calls = mock_trainer.calls("chat", "harbor-eval-model")
    assert len(calls) == sum(r["llm_calls"] for r in results)
    assert {call["body"]["model"] for call in calls} == {"gpt-5-mini"}
    assert {call["headers"].get("authorization") for call in calls} == {f"Bearer {MODEL_KEY}"}
    # Each trial removed its sandbox as it ended.
    for result in results:
        label = f"{ROLLOUT_LABEL}={result['rollout_id']}"
        assert not engine.containers.list(all=True, filters={"label": label}), label

    # In one process, without a fleet: the same bridge, the same sandboxes (their images,
    # built by the fleet's workers above, are reused: no worker settings apply here).
    started = time.monotonic()
    local = run_eval(
        config,
        eval_env(docker_config),
        *("--base-url", model, "--rows", "0,3", "-o", str(runs), "--name", "local", "-q"),
        cli="sdk",
    )
    in_one_process = time.monotonic() - started
    assert local.returncode == 0, local.stdout + local.stderr
    assert f"model bridge on http://{host_address()}:" in local.stdout
    in_process = sorted(results_of(runs / "local"), key=lambda result: result["row"])
    assert [(r["row"], r["status"], r["reward"]) for r in in_process] == [
        (0, "success", 1.0),
        (3, "success", 0.0),
    ], in_process
    print(
        f"4 rows on a fleet started for the run: {on_fleet:.1f}s; 2 in one process: "
        f"{in_one_process:.1f}s (each from the command's start to its exit)"
    )


def test_a_loopback_bridge_host_for_a_sandboxed_agent_is_refused_in_one_line(
    docker_config: Path, tmp_path: Path
) -> None:
    """No container reaches this host's loopback: the run says so before it starts anything."""
    config = write_template_workspace(tmp_path / "workspace", QUESTIONS[:1])
    run = run_eval(
        config,
        eval_env(docker_config),
        *("--base-url", "http://127.0.0.1:9/v1", "--bridge-host", "127.0.0.1"),
        *("-o", str(tmp_path / "runs")),
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "Traceback" not in output
    assert output.strip().splitlines() == [
        "Error: bridge_host 127.0.0.1 is this host's loopback, which the agent's docker "
        "sandboxes cannot reach: leave bridge_host out (the bridge then listens on this host's "
        "address on its default route) or give an address their containers reach"
    ]
    assert not (tmp_path / "runs").exists()  # refused before the run's folder was made
