"""How long the command lines take to start: ``rollout-fleet --help``, ``rollout-sdk --help``
and ``rollout-fleet status <id>`` against a local Redis holding a fleet, each the median of
several runs of the installed console script, beside the interpreter alone
(``python -c pass``) measured in the same run. Reported, not judged: the machine's load moves
wall-clock figures, so each line also carries the child's CPU time.

The children run with bytecode caching on, as on any installed copy (a warm-up run writes the
caches; ``PYTHONDONTWRITEBYTECODE`` is dropped for them). One more line shows ``status``
compiling every module from source, as it does where caching is off and no cache was written.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from bench.systems import BIN
from rollout_core.settings import FleetSettings
from rollout_core.store import RecordField, RecordStore
from rollout_fleet.redis_server import RedisServer

ROLLOUT_ID = "bench-cli-start"


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median wall-clock and CPU milliseconds of ``runs`` runs of ``argv`` (after one
    unmeasured warm-up run); each must exit 0."""
    subprocess.run(argv, env=env, capture_output=True, check=True)
    walls, cpus = [], []
    for _ in range(runs):
        cpu, started = _child_cpu(), time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True)
        walls.append(time.perf_counter() - started)
        cpus.append(_child_cpu() - cpu)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


async def seed_fleet(redis_url: str, rollout_ids: Iterable[str]) -> None:
    """A fleet with the default key prefix in ``redis_url`` (its queue registered, as its
    processes do when they start) holding a queued v2 rollout for each id."""
    store = RecordStore.connect(FleetSettings(redis_url=redis_url), max_connections=2)
    try:
        await store.own_queue()
        for rollout_id in rollout_ids:
            await store.admit_v2(
                store.keys.record("v2", rollout_id),
                max_queued=100,
                polling_lease_seconds=60,
                ttl_seconds=600,
                message="MSG",
                lease_digest="digest",
                fields={RecordField.PROTOCOL: "v2", RecordField.ROLLOUT_ID: rollout_id},
            )
    finally:
        await store.aclose()


async def cli_start(scale: float) -> list[dict[str, Any]]:
    """The start-time lines: the baseline first, then each command beside it."""
    runs = max(3, round(10 * scale))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("REDIS_URL", None)
    server = RedisServer().start()
    try:
        await seed_fleet(server.url, [ROLLOUT_ID])
        status = [str(BIN / "rollout-fleet"), "status", ROLLOUT_ID, "--json"]
        commands = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            "rollout-fleet --help": ([str(BIN / "rollout-fleet"), "--help"], env),
            "rollout-sdk --help": ([str(BIN / "rollout-sdk"), "--help"], env),
            "rollout-fleet status <id>": (status, {**env, "REDIS_URL": server.url}),
        }
        with tempfile.TemporaryDirectory() as empty:
            uncached = {
                **env,
                "REDIS_URL": server.url,
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPYCACHEPREFIX": empty,  # no cache to read: every module compiles
            }
            commands["rollout-fleet status <id>, no bytecode cache"] = (status, uncached)
            figures = {name: _timed(argv, child, runs) for name, (argv, child) in commands.items()}
    finally:
        server.stop()
    base_wall, base_cpu = figures.pop("python -c pass")
    lines = [_line("python -c pass (baseline) ms", base_wall, base_cpu, runs)]
    for name, (wall, cpu) in figures.items():
        line = _line(f"{name} ms", wall, cpu, runs)
        line["over_baseline_ms"] = line["value"] - round(base_wall)
        lines.append(line)
    return lines


def _line(figure: str, wall_ms: float, cpu_ms: float, runs: int) -> dict[str, Any]:
    return {
        "figure": figure,
        "value": round(wall_ms),
        "target": "report",
        "met": True,
        "cpu_ms": round(cpu_ms),
        "runs": runs,
    }


__all__ = ["cli_start", "seed_fleet"]
