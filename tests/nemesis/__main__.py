"""``python -m tests.nemesis --seed N``: one run, its figures, and 1 if an invariant broke."""

from __future__ import annotations

from typing import Annotated

import typer

from tests.nemesis.run import FULL_SIZE, Size, replay_command, run


def main(
    seed: Annotated[int, typer.Option(help="The schedule's seed")] = 1,
    rollouts: Annotated[int, typer.Option(help="Rollouts, both fleets")] = FULL_SIZE.rollouts,
    faults: Annotated[int, typer.Option(help="Faults in the schedule")] = FULL_SIZE.faults,
    duration: Annotated[float, typer.Option(help="Seconds of load")] = FULL_SIZE.duration,
    only: Annotated[
        list[str] | None, typer.Option(help="Draw faults of these kinds only (repeatable)")
    ] = None,
    callback_delay: Annotated[
        float, typer.Option(help="Seconds the TrainGate holds each v1 callback")
    ] = 0.0,
) -> None:
    size = Size(rollouts, faults, duration, tuple(only or ()), callback_delay)
    report = run(seed, size)
    figures = {k: v for k, v in report.figures.items() if k not in ("faults", "logs")}
    typer.echo(figures)
    if report.violations:
        typer.echo(f"{len(report.violations)} violations; replay: {replay_command(seed, size)}")
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
