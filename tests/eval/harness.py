"""``eval run`` as a user runs it, from either command line (``fleet``: ``rollout-fleet``,
``sdk``: ``rollout-sdk``): calculator rows with known wrong ground truths, the command, its
results and figures, and a run stopped half way by a signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_fleet.local import fleet_command
from rollout_fleet.processes import wait_until
from rollout_sdk.evaluation.results import RESULTS_FILE
from tests.harness import REPO, MockTrainGateClient

FIXTURE_ROWS = REPO.parent / "shared" / "fixtures" / "example_calculator_test_data.jsonl"


CALCULATOR = "examples/calculator/server.py:agent_loop"


WRONG_ROWS = {1, 3}  # of every five: their ground truth is off by one


def calculator_rows(path: Path, count: int) -> Path:
    """``count`` calculator rows (the fixture's five, over and over); rows 1 and 3 of every
    five carry a wrong ground truth, so the agent's right answer scores 0 there."""
    if not FIXTURE_ROWS.is_file():
        pytest.skip(f"the shared fixtures are not here ({FIXTURE_ROWS})")
    fixture = [json.loads(line) for line in FIXTURE_ROWS.read_text().splitlines()]
    with path.open("w") as rows:
        for index in range(count):
            row = dict(fixture[index % 5])
            if index % 5 in WRONG_ROWS:
                row["ground_truth"] = str(int(row["ground_truth"]) + 1)
            rows.write(json.dumps(row) + "\n")
    return path


# A state directory of the session's own: no ``rollout-fleet up`` another test (or session)
# runs is taken for a warm fleet.
NO_UP_HERE = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="eval-state-")}


def model_url(mock: MockTrainGateClient) -> str:
    return f"{mock.url}/v1/rollouts/eval-model"


def eval_command(cli: str, *args: str) -> list[str]:
    if cli == "fleet":
        return fleet_command("eval", "run", *args)
    return [sys.executable, "-m", "rollout_sdk.cli", "eval", "run", *args]


def run_eval(
    cli: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    succeeds: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``eval run *args`` to its end (``env``: by default this one's, in a state directory
    of the session's own); it must exit 0 unless ``succeeds`` is false."""
    run = subprocess.run(
        eval_command(cli, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **NO_UP_HERE} if env is None else env,
    )
    if succeeds:
        assert run.returncode == 0, run.stdout + run.stderr
    return run


def metrics_of(run_dir: Path) -> dict[str, Any]:
    metrics: dict[str, Any] = json.loads((run_dir / "metrics.json").read_text())
    return metrics


def results_of(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / RESULTS_FILE).read_text().splitlines()
    return [json.loads(line) for line in lines]


def isolated_env(runtime_dir: Path, **extra: str) -> dict[str, str]:
    """No ``up`` of another test (or session) is found: the state directory is the test's."""
    runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir), "COLUMNS": "200", **extra}


def stop_when(
    cli: str,
    args: list[str],
    env: dict[str, str],
    signum: signal.Signals,
    ready: Callable[[subprocess.Popen[str]], bool],
    what: str,
) -> tuple[str, float, int]:
    """Start ``eval run``, send ``signum`` once ``ready(process)`` holds (``what`` it waits
    for); (output, seconds from the signal to the exit, exit code)."""
    process = subprocess.Popen(
        eval_command(cli, *args),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: ready(process), 300, what)
        process.send_signal(signum)
        sent = time.monotonic()
        output, _ = process.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    return output, took, process.returncode


def stop_half_way(
    cli: str,
    args: list[str],
    run_dir: Path,
    env: dict[str, str],
    signum: signal.Signals,
    after: int = 30,
) -> tuple[str, float, int]:
    """Send ``signum`` once ``after`` items are kept; as :func:`stop_when`."""
    results = run_dir / RESULTS_FILE

    def kept(_: subprocess.Popen[str]) -> bool:
        return results.is_file() and len(results.read_text().splitlines()) >= after

    return stop_when(cli, args, env, signum, kept, f"{after} results")
