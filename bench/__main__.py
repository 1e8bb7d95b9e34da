"""Run the benchmark suite: ``uv run python -m bench [POINT...] [--scale S]``.

Each point measures the fleet and a baseline (our in-process server; for ``upstream`` and
``sandboxes``, upstream osmosis-ai's) in the same run, against the same mock TrainGate process
(``sandboxes``: on the same Docker engine, DOCKER_HOST or the test engine), and prints
one JSON line per system plus one per target (met or not, and the gap); a table follows.
Lines are also written to ``bench-output/last-run.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bench.points import POINTS

OUTPUT = Path("bench-output/last-run.jsonl")
app = typer.Typer(add_completion=False)


@app.command()
def main(
    points: Annotated[
        list[str] | None, typer.Argument(help=f"Points to run: {', '.join(POINTS)}")
    ] = None,
    scale: Annotated[float, typer.Option(help="Multiply every point's rollout count")] = 1.0,
) -> None:
    chosen = points or list(POINTS)
    unknown = set(chosen) - set(POINTS)
    if unknown:
        raise typer.BadParameter(f"unknown points {sorted(unknown)}; choose from {list(POINTS)}")
    OUTPUT.parent.mkdir(exist_ok=True)
    lines: list[dict[str, Any]] = []
    with OUTPUT.open("w") as out:
        for name in chosen:
            for figures in asyncio.run(POINTS[name](scale)):
                line = {"point": name, **figures}
                print(json.dumps(line), flush=True)
                out.write(json.dumps(line) + "\n")
                lines.append(line)
    _table(lines)


def _table(lines: list[dict[str, Any]]) -> None:
    table = Table(title="Rollout Fleet benchmark")
    for column in (
        "point",
        "system",
        "rollouts/s",
        "p50 ms",
        "p99 ms",
        "CPU ms/rollout",
        "peak RSS MB",
        "errors",
        "vs baseline / target",
    ):
        table.add_column(column)
    for line in lines:
        if "system" in line:
            table.add_row(
                line["point"],
                line["system"],
                str(line.get("trials_per_s", line.get("rollouts_per_s", ""))),
                str(line.get("p50_ms", "")),
                str(line.get("p99_ms", "")),
                str(line.get("server_cpu_ms_per_rollout", "")),
                str(round(sum(line.get("peak_rss_mb", {}).values()))),
                str(sum(line.get("errors", {}).values())),
                line.get("blocker", ""),
            )
        else:
            table.add_row(
                line["point"],
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                _verdict(line),
            )
    Console().print(table)


def _verdict(line: dict[str, Any]) -> str:
    """``figure: value (target …): met`` or ``… NOT MET, gap …``; reported figures alone."""
    text = f"{line['figure']}: {line['value']}"
    if line["target"] == "report":
        return text
    outcome = "met" if line["met"] else "NOT MET"
    gap = f", gap {line['gap']:+g}" if "gap" in line and not line["met"] else ""
    return f"{text} (target {line['target']}): {outcome}{gap}"


if __name__ == "__main__":
    app()
