"""The ``rollout-sdk test`` command's work: read the rows, start the bridge, run the rows
(with a progress bar, or interactively), print the summary and write the outputs."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollout_sdk.config import RolloutSettings, get_settings
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import Agent
from rollout_sdk.localrun.bridge import LLMBridge
from rollout_sdk.localrun.dataset import DatasetRow, read_rows, v1_row, v2_row
from rollout_sdk.localrun.interactive import ConsoleStepper, step_through
from rollout_sdk.localrun.report import Summary, passes, write_output
from rollout_sdk.localrun.runner import LocalRunner, RowResult, RunOptions

# A person reads at the prompt: the agent's own LLM client must not time out meanwhile.
INTERACTIVE_TIMEOUT_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class TestOptions:
    dataset: Path
    model: str
    base_url: str
    api_key: str | None = None
    offset: int = 0
    limit: int | None = None
    concurrency: int = 1
    interactive: bool = False
    row: int | None = None
    output: Path | None = None
    quiet: bool = False
    pass_threshold: float = 1.0
    run: RunOptions = field(default_factory=RunOptions)


def load_rows(agent: Agent, options: TestOptions) -> list[DatasetRow]:
    """The rows in the window, checked for what this agent's generation needs."""
    to_row = v1_row if isinstance(agent, RolloutAgentLoop) else v2_row
    rows = read_rows(options.dataset)
    end = None if options.limit is None else options.offset + options.limit
    return [
        to_row(row, index)
        for index, row in enumerate(rows)
        if options.offset <= index and (end is None or index < end)
    ]


def _settings(interactive: bool) -> RolloutSettings:
    settings = get_settings()
    if not interactive:
        return settings
    client = settings.client.model_copy(update={"timeout_seconds": INTERACTIVE_TIMEOUT_SECONDS})
    return settings.model_copy(update={"client": client})


async def _batch(
    runner: LocalRunner, rows: list[DatasetRow], options: TestOptions, console: Console
) -> list[RowResult]:
    columns: list[Any] = [
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("completed {task.fields[ended_ok]} · passed {task.fields[passed]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, disable=options.quiet) as progress:
        # ("completed" is the bar's own position, hence ended_ok)
        bar = progress.add_task("rows", total=len(rows), ended_ok=0, passed=0)
        completed = passed = 0

        def done(result: RowResult) -> None:
            nonlocal completed, passed
            completed += result.success
            passed += passes(result, options.pass_threshold)
            progress.update(bar, advance=1, ended_ok=completed, passed=passed)

        return await runner.run_rows(rows, options.concurrency, done)


async def run_test(
    agent: Agent, rows: list[DatasetRow], options: TestOptions, console: Console
) -> Summary:
    stepper = ConsoleStepper(console) if options.interactive else None
    bridge = LLMBridge(
        options.base_url,
        options.model,
        options.api_key,
        stepper=stepper,
        trace=options.run.log_dir is not None,
    )
    if options.run.log_dir is not None:
        options.run.log_dir.mkdir(parents=True, exist_ok=True)
    runner = LocalRunner(agent, bridge, options.run, _settings(options.interactive))
    started = time.monotonic()
    await bridge.start()
    try:
        if stepper is not None:
            first = options.row if options.row is not None else rows[0].index
            results = await step_through(runner, stepper, rows, first)
        else:
            results = await _batch(runner, rows, options, console)
    finally:
        await bridge.stop()
    wall_ms = (time.monotonic() - started) * 1000
    summary = Summary.of(results, wall_ms, options.pass_threshold, bridge.fatal)
    if options.output is not None:
        await asyncio.to_thread(write_output, options.output, results, summary)
    return summary


__all__ = ["TestOptions", "load_rows", "run_test"]
