"""Where a worker's CPU goes, per rollout: ``uv run python -m bench.profile [v1|v2]``.

Runs the anchor workloads on a fleet of one worker process (the v1 calculator, two LLM calls;
v2 the Strands workflow of the ``upstream`` point through ``osmosis_ai``; TrainGate latency
100 ms, C = 256) with ``bench/stack_sampler.py`` sampling the worker's threads every 2 ms,
then prints the worker's CPU per rollout split by code area (the share of busy samples whose
stack holds it; areas overlap: a call of the SDK into httpx counts for both) and the
functions it was in most (self time).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from bench.measure import Usage
from bench.points import CALCULATOR, STRANDS_OSMOSIS, WARMUP, v1_drive, v2_drive
from bench.systems import fleet, traingate

SAMPLER = Path(__file__).parent / "sampler"
DUMP_WAIT_SECONDS = 2.5  # the sampler writes its counts every 2 s


async def profile(protocol: str, count: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="profile-"))
    agent = CALCULATOR if protocol == "v1" else STRANDS_OSMOSIS
    env = {"PYTHONPATH": str(SAMPLER), "BENCH_PROFILE_OUT": str(folder)}
    with traingate(0.1) as trainer:
        drive = v1_drive(trainer, 256) if protocol == "v1" else v2_drive(trainer, 256)
        with fleet(agent, 1, 256, env) as system:
            (worker,) = system.roles["workers"]
            out = folder / f"{worker}.json"
            await drive(system, WARMUP, "warmup")
            await asyncio.sleep(DUMP_WAIT_SECONDS)  # the warm-up's samples written
            before = json.loads(out.read_text())
            with Usage({"workers": system.roles["workers"]}) as usage:
                run = await drive(system, count, "run")
            await asyncio.sleep(DUMP_WAIT_SECONDS)
            after = json.loads(out.read_text())
            seconds = usage.cpu["workers"]
    figures = {
        "period": (after["seconds"] - before["seconds"])
        / max(1, after["rounds"] - before["rounds"]),
        "busy": after["busy"] - before["busy"],
        "idle": after["idle"] - before["idle"],
        "inclusive": dict(Counter(after["inclusive"]) - Counter(before["inclusive"])),
        "leaf_area": dict(Counter(after["leaf_area"]) - Counter(before["leaf_area"])),
        "own": dict((Counter(after["own"]) - Counter(before["own"])).most_common(15)),
        "self": dict((Counter(after["self"]) - Counter(before["self"])).most_common(20)),
    }
    busy = max(1, figures["busy"])
    completed = max(1, len(run.latencies))
    per_rollout = seconds / completed * 1000
    ms = figures["period"] * 1000 / completed  # one sample, per rollout
    python = busy * ms
    print(f"{protocol}: {completed} rollouts, worker CPU {per_rollout:.2f} ms/rollout")
    print(
        f"  Python code sampled: {python:.2f} ms/rollout; the rest ({per_rollout - python:.2f}) "
        "is uvloop's C loop and sockets, the interpreter's own work and threads' waits"
    )
    print("by area (inclusive: a stack holding it; ms/rollout, share of Python time):")
    for name, hits in sorted(figures["inclusive"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:14} {hits * ms:6.2f}  {hits / busy:6.1%}")
    print("by area (self: the code running; ms/rollout, share of Python time):")
    for name, hits in sorted(figures["leaf_area"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:14} {hits * ms:6.2f}  {hits / busy:6.1%}")
    print("fleet and SDK functions (innermost on the stack, with what they call):")
    for name, hits in figures["own"].items():
        print(f"  {hits * ms:6.3f}  {hits / busy:6.1%}  {name}")
    print("functions (self; ms/rollout, share of Python time):")
    for name, hits in list(figures["self"].items())[:20]:
        print(f"  {hits * ms:6.3f}  {hits / busy:6.1%}  {name}")


def main(
    protocol: Annotated[str, typer.Argument(help="v1 or v2")] = "v1",
    count: Annotated[int, typer.Option(help="Rollouts measured")] = 2000,
) -> None:
    asyncio.run(profile(protocol, count))


if __name__ == "__main__":
    typer.run(main)
