"""``python -m tests.nemesis --seed N``: one run, its figures, and 1 if an invariant broke.

``--sentinel`` runs it on Redis that fails over (a primary, a replica, three sentinels), at
its own full size unless sizes are given, with at least ``--failovers`` failovers."""

from __future__ import annotations

from typing import Annotated

import typer

from tests.nemesis.run import FULL_SIZE, SENTINEL_FULL_SIZE, Size, replay_command, run


def main(
    seed: Annotated[int, typer.Option(help="The schedule's seed")] = 1,
    rollouts: Annotated[int | None, typer.Option(help="Rollouts, both fleets")] = None,
    faults: Annotated[int | None, typer.Option(help="Faults in the schedule")] = None,
    duration: Annotated[float | None, typer.Option(help="Seconds of load")] = None,
    only: Annotated[
        list[str] | None, typer.Option(help="Draw faults of these kinds only (repeatable)")
    ] = None,
    callback_delay: Annotated[
        float, typer.Option(help="Seconds the TrainGate holds each v1 callback")
    ] = 0.0,
    sentinel: Annotated[
        bool, typer.Option(help="Redis that fails over: a primary, a replica, three sentinels")
    ] = False,
    failovers: Annotated[
        int | None, typer.Option(help="--sentinel: at least this many failovers")
    ] = None,
    admission_replicas: Annotated[
        int, typer.Option(help="--sentinel: ROLLOUT_FLEET_ADMISSION_REPLICAS (0: no WAIT)")
    ] = 1,
    replica_lag: Annotated[
        float, typer.Option(help="--sentinel: cut the replica off this long before each kill")
    ] = 0.0,
    settle: Annotated[
        float, typer.Option(help="Seconds past --duration to wait for every rollout to end")
    ] = 120.0,
) -> None:
    full = SENTINEL_FULL_SIZE if sentinel else FULL_SIZE
    if replica_lag >= 1.0:
        raise typer.BadParameter("under 1 s: the checker's crash window", param_hint="lag")
    size = Size(
        rollouts if rollouts is not None else full.rollouts,
        faults if faults is not None else full.faults,
        duration if duration is not None else full.duration,
        tuple(only or ()),
        callback_delay,
        sentinel,
        failovers if failovers is not None else full.failovers,
        admission_replicas,
        replica_lag,
        settle,
    )
    report = run(seed, size)
    typer.echo(report.summary())
    if report.found:
        typer.echo(f"{len(report.found)} violations; replay: {replay_command(seed, size)}")
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
