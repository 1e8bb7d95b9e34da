"""The nemesis at CI size: a seeded fault schedule over mixed v1 and v2 rollouts on two fleets
sharing one Redis, then every invariant (``checker``). ``NEMESIS_SEED`` picks another seed."""

from __future__ import annotations

import os
from pathlib import Path

from tests.nemesis.run import CI_SIZE, replay_command, run


def test_the_promise_holds_under_a_random_fault_schedule(tmp_path: Path) -> None:
    seed = int(os.environ.get("NEMESIS_SEED", "1414"))
    report = run(seed, CI_SIZE, tmp_path)
    assert not report.violations, (
        f"seed {seed} broke the promise; replay: {replay_command(seed, CI_SIZE)}\n"
        + "\n".join(report.violations)
        + f"\n{report.figures.get('logs', '')}"
    )
    assert report.figures["admitted"] == {"v1": CI_SIZE.rollouts // 2, "v2": CI_SIZE.rollouts // 2}
