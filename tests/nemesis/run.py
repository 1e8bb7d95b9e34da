"""One nemesis run: start the stage, offer rollouts to both fleets while the schedule's faults
land, then check; the figures go to ``test-output/nemesis/seed-<seed>.json``."""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos.harness import Protocol, Trainer
from tests.harness import REPO, v1_body, v2_body
from tests.nemesis.checker import Report, check
from tests.nemesis.faults import GROUPS, SENTINEL_KINDS, Fault, Nemesis, schedule
from tests.nemesis.stage import Stage

FIGURES = REPO / "test-output" / "nemesis"
ROLLOUT_SECONDS = (1.0, 6.0)


@dataclass(frozen=True)
class Size:
    rollouts: int  # both protocols together
    faults: int
    duration: float  # seconds over which rollouts are offered and faults land
    only: tuple[str, ...] = ()  # fault kinds to draw from (all if empty)
    callback_delay: float = 0.0  # seconds the TrainGate holds each v1 callback (a slow one)
    sentinel: bool = False  # the sentinel stage (primary, replica, three sentinels)
    failovers: int = 0  # the sentinel stage: at least this many failovers in the schedule
    admission_replicas: int = 1  # the sentinel stage: ROLLOUT_FLEET_ADMISSION_REPLICAS
    replica_lag: float = 0.0  # the sentinel stage: replica cut off this long before a kill


CI_SIZE = Size(rollouts=200, faults=14, duration=45)
FULL_SIZE = Size(rollouts=1000, faults=36, duration=150)
SENTINEL_CI_SIZE = Size(rollouts=200, faults=16, duration=45, sentinel=True, failovers=3)
SENTINEL_FULL_SIZE = Size(rollouts=600, faults=30, duration=120, sentinel=True, failovers=6)


def bodies(seed: int, protocol: Protocol, count: int, trainer_url: str) -> list[dict[str, Any]]:
    """Rollouts that wait, chat once and wait again: ids ``<protocol>-g<group>-<seed>-<n>``."""
    rng = random.Random(f"{seed}-{protocol}")
    made = []
    for n in range(count):
        rollout_id = f"{protocol}-g{n % GROUPS}-{seed}-{n}"
        before, after = (rng.uniform(*ROLLOUT_SECONDS) / 2 for _ in range(2))
        if protocol == "v1":
            steps = [{"sleep": before}, {"chat": {}}, {"sleep": after}, {"complete": {}}]
            made.append(v1_body(trainer_url, rollout_id, metadata={"script": steps}))
        else:
            steps = [{"sleep": before}, {"chat": {}}, {"sleep": after}]
            made.append(v2_body(trainer_url, rollout_id, metadata={"script": steps}))
    return made


def replay_command(seed: int, size: Size) -> str:
    only = "".join(f" --only {kind}" for kind in size.only)
    sentinel = (
        f" --sentinel --failovers {size.failovers} --admission-replicas "
        f"{size.admission_replicas} --replica-lag {size.replica_lag:g}"
        if size.sentinel
        else ""
    )
    return (
        f"uv run python -m tests.nemesis --seed {seed} --rollouts {size.rollouts} "
        f"--faults {size.faults} --duration {size.duration:g}{only} "
        f"--callback-delay {size.callback_delay:g}{sentinel}"
    )


def run(seed: int, size: Size, workdir: Path | None = None) -> Report:
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"nemesis-{seed}-"))
    started = time.monotonic()
    stage = Stage(workdir, size.sentinel, size.admission_replicas, size.replica_lag).start()
    try:
        report = _exercise(seed, size, stage)
        if report.violations:
            report.figures["logs"] = stage.logs(1500)[-20000:]
    finally:
        stage.stop()
    report.figures |= {
        "seed": seed,
        "size": size.__dict__,
        "run_s": round(time.monotonic() - started, 1),
        "violations": report.violations,
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / _figures_name(seed, size)).write_text(
        json.dumps(report.figures, indent=1, default=str)
    )
    return report


def _exercise(seed: int, size: Size, stage: Stage) -> Report:
    """Offer the rollouts while the schedule's faults land, then check."""
    if size.callback_delay:
        slow = {"target": "completed", "delay_s": size.callback_delay, "times": None}
        stage.trainer.add_faults(slow)
    offered = {p: bodies(seed, p, size.rollouts // 2, stage.trainer.url) for p in ("v1", "v2")}
    pace = size.duration / max(1, size.rollouts // 2)
    trainers: dict[Protocol, Trainer] = {
        p: Trainer(p, stage.fleets[p].gateway_urls, offered[p], pace=pace).start()
        for p in ("v1", "v2")
    }
    by_id = {body["rollout_id"]: body for made in offered.values() for body in made}
    nemesis = Nemesis(stage, _schedule(seed, size), trainers, by_id)
    nemesis.start().join(size.duration + 120)
    for trainer in trainers.values():
        _join(trainer, size.duration + 240)
    return check(stage, nemesis, trainers)


def _schedule(seed: int, size: Size) -> list[Fault]:
    if not size.sentinel:
        return schedule(seed, size.faults, size.duration, size.only)
    at_least = {"failover": size.failovers}
    return schedule(seed, size.faults, size.duration, size.only, SENTINEL_KINDS, at_least)


def _join(trainer: Trainer, timeout: float) -> None:
    """Wait for a trainer. Answers it did not expect are the checker's to report (with the
    rest of the run's figures), not an exception that loses them."""
    try:
        trainer.join(timeout)
    except AssertionError as exc:
        if "still busy" in str(exc):
            raise


def _figures_name(seed: int, size: Size) -> str:
    parts = [f"seed-{seed}", *size.only]
    if size.sentinel:
        parts += [f"sentinel-wait{size.admission_replicas}"]
        parts += [f"lag{size.replica_lag:g}"] if size.replica_lag else []
    return "-".join(parts) + ".json"


__all__ = [
    "CI_SIZE",
    "FULL_SIZE",
    "SENTINEL_CI_SIZE",
    "SENTINEL_FULL_SIZE",
    "Size",
    "replay_command",
    "run",
]
