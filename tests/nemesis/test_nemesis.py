"""The nemesis at CI size: a seeded fault schedule over mixed v1 and v2 rollouts on two fleets
sharing one Redis, then every invariant (``checker``). ``NEMESIS_SEED`` picks another seed.
The TrainGate holds each v1 callback ``callback_delay`` seconds, so the schedule's cancels in
the delivery window find rollouts delivering (the test asserts some did).

The same on Redis that fails over (``SENTINEL_CI_SIZE``): a primary, a replica and three
sentinels, every fleet process given the sentinels' URL, admissions waiting for the replica
(``ROLLOUT_FLEET_ADMISSION_REPLICAS=1``), and at least three failovers among the faults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.nemesis.run import CI_SIZE, SENTINEL_CI_SIZE, Size, replay_command, run


def test_the_promise_holds_under_a_random_fault_schedule(tmp_path: Path) -> None:
    seed = int(os.environ.get("NEMESIS_SEED", "1414"))
    figures = _holds(seed, CI_SIZE, tmp_path)
    assert figures["delivering_cancels_landed"] > 0, figures["delivering_cancels"]


def test_the_promise_holds_through_sentinel_failovers(tmp_path: Path) -> None:
    seed = int(os.environ.get("NEMESIS_SEED", "1415"))
    report = _holds(seed, SENTINEL_CI_SIZE, tmp_path)
    assert report["crashes"]["failover"] >= SENTINEL_CI_SIZE.failovers
    assert len(report["failovers"]) == report["crashes"]["failover"]  # every one completed


def _holds(seed: int, size: Size, workdir: Path) -> dict[str, Any]:
    report = run(seed, size, workdir)
    assert not report.found, (
        f"seed {seed} broke the promise; replay: {replay_command(seed, size)}\n"
        + report.summary()
        + f"\n{report.figures.get('logs', '')}"
    )
    assert report.figures["admitted"] == {"v1": size.rollouts // 2, "v2": size.rollouts // 2}
    return report.figures
