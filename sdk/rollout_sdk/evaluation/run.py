"""An evaluation run: plan the work items, run the pending ones through an executor, keep
each result as it comes, then write ``metrics.json`` and ``report.html`` and print a summary.

Interrupted (Ctrl-C), a run keeps what finished and says how to resume it: the same command
with the same ``--name`` runs only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.evaluation.config import EvalConfig, ModelEndpoint
from rollout_sdk.evaluation.metrics import EvalMetrics, model_metrics
from rollout_sdk.evaluation.report import render
from rollout_sdk.evaluation.results import (
    METRICS_FILE,
    REPORT_FILE,
    ItemResult,
    RunDirectory,
    RunPlan,
    Tokens,
    WorkItem,
    by_model,
)
from rollout_sdk.evaluation.scoring import EvalFn, EvalFnError
from rollout_sdk.loader import Agent
from rollout_sdk.localrun.bridge import LLMBridge
from rollout_sdk.localrun.dataset import DatasetError, DatasetRow, read_rows, v1_row, v2_row
from rollout_sdk.localrun.runner import RowResult

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Job:
    """One work item, handed to an executor."""

    item: WorkItem
    rollout_id: str
    row: DatasetRow
    metadata: dict[str, Any]  # added to the row's own: its index and sample
    bridge: LLMBridge  # the item's model, as a TrainGate


class Executor(Protocol):
    """Runs jobs: in this process, or on a fleet. Entered once around the whole run."""

    @property
    def bridge_host(self) -> str:
        """Where the rollouts reach this machine's bridges."""
        ...

    @property
    def default_in_flight(self) -> int:
        """Jobs at once unless the run says."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def run(self, job: Job) -> RowResult: ...


@dataclass(frozen=True)
class EvalOptions:
    name: str | None = None  # resume the run of that name
    output: Path = Path(".rollout-fleet") / "evals"  # the CLI's default too
    rows: str | None = None  # "0-9,15"
    max_in_flight: int | None = None
    fresh: bool = False
    retry_failed: bool = False
    quiet: bool = False
    eval_fns: Sequence[EvalFn] = field(default_factory=tuple)


@dataclass(frozen=True)
class EvalOutcome:
    directory: Path
    metrics: EvalMetrics
    interrupted: bool


class EvalError(Exception):
    """The run cannot start (rows, names, run directory); the message says why."""


def select_rows(count: int, selector: str | None, limit: int | None) -> list[int]:
    """Row indexes from ``"0-9,15"`` (all rows without one), the first ``limit`` of them."""
    chosen: list[int] = []
    for part in (selector or f"0-{count - 1}" if count else "").split(","):
        if not part.strip():
            continue
        first, _, last = part.strip().partition("-")
        try:
            span = range(int(first), int(last or first) + 1)
        except ValueError as exc:
            raise EvalError(f"--rows {selector!r}: use indexes and ranges, like 0-9,15") from exc
        chosen += [index for index in span if index < count and index not in chosen]
    return chosen[:limit] if limit is not None else chosen


def _rows(agent: Agent, config: EvalConfig, options: EvalOptions) -> dict[int, DatasetRow]:
    to_row = v1_row if isinstance(agent, RolloutAgentLoop) else v2_row
    try:
        raw = read_rows(config.dataset)
        indexes = select_rows(len(raw), options.rows, config.limit)
        return {index: to_row(raw[index], index) for index in indexes}
    except DatasetError as exc:
        raise EvalError(str(exc)) from exc


def _plan(config: EvalConfig, options: EvalOptions, rows: Sequence[int]) -> RunPlan:
    models = {"policy": config.model.model}
    if config.baseline is not None:
        models["baseline"] = config.baseline.model
    return RunPlan(
        agent=config.agent,
        dataset=str(config.dataset),
        rows=list(rows),
        n=config.n,
        models=models,
        pass_threshold=config.pass_threshold,
        eval_fns=[fn.name for fn in options.eval_fns],
    )


def default_name(config: EvalConfig) -> str:
    stem = (config.source or Path(config.agent.partition(":")[0])).stem or "eval"
    return f"{re.sub(r'[^A-Za-z0-9._-]', '-', stem)[:40]}-{time.strftime('%Y%m%d-%H%M%S')}"


async def _scored(
    job: Job, outcome: RowResult, options: EvalOptions, threshold: float
) -> ItemResult:
    """An executor's outcome as a result: scored by the eval functions when there are any
    (the first one's score is the reward), else with the rollout's own reward."""
    scores: dict[str, float] = {}
    error, category = outcome.error, outcome.error_category
    metadata = {**job.row.extra, **job.metadata}
    try:
        for fn in options.eval_fns:
            scores[fn.name] = await fn.score(outcome.messages, job.row.ground_truth, metadata)
    except EvalFnError as exc:
        error, category = str(exc), "eval_fn_error"
    except Exception as exc:  # the user's function failed: this item, not the run
        error, category = f"eval function raised {type(exc).__name__}: {exc}", "eval_fn_error"
    reward = next(iter(scores.values())) if options.eval_fns and scores else outcome.reward
    succeeded = outcome.success and category != "eval_fn_error"
    return ItemResult(
        model=job.item.model,
        row=job.item.row,
        sample=job.item.sample,
        rollout_id=job.rollout_id,
        status="success" if succeeded else "failure",
        reward=reward,
        passed=succeeded and reward is not None and reward >= threshold,
        scores=scores,
        error=None if succeeded else error,
        error_category=None if succeeded else category,
        latency_ms=outcome.duration_ms,
        llm_calls=outcome.llm_calls,
        tokens=Tokens(
            prompt=outcome.token_usage.get("prompt_tokens", 0),
            completion=outcome.token_usage.get("completion_tokens", 0),
            total=outcome.token_usage.get("total_tokens", 0),
        ),
    )


class _Bridges:
    """One local TrainGate per model of the run."""

    def __init__(self, endpoints: dict[str, ModelEndpoint]) -> None:
        self.by_model = {
            name: LLMBridge(endpoint.base_url, endpoint.model, endpoint.api_key)
            for name, endpoint in endpoints.items()
        }

    async def __aenter__(self) -> _Bridges:
        return self

    async def start(self, host: str) -> None:
        for bridge in self.by_model.values():
            await bridge.start(host)

    async def __aexit__(self, *_: object) -> None:
        for bridge in self.by_model.values():
            await bridge.stop()


async def _dispatch(
    jobs: list[Job],
    executor: Executor,
    run: RunDirectory,
    options: EvalOptions,
    threshold: float,
    console: Console,
) -> None:
    slots = asyncio.Semaphore(options.max_in_flight or executor.default_in_flight)
    columns: list[Any] = [
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("passed {task.fields[passed]} · failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, disable=options.quiet) as progress:
        bar = progress.add_task("rollouts", total=len(jobs), passed=0, failed=0)
        passed = failed = 0

        async def one(job: Job) -> None:
            async with slots:
                outcome = await executor.run(job)
            job.bridge.forget(job.rollout_id)
            result = await _scored(job, outcome, options, threshold)
            await run.append(result)
            nonlocal passed, failed
            passed += result.passed
            failed += result.status == "failure"
            progress.update(bar, advance=1, passed=passed, failed=failed)

        async with asyncio.TaskGroup() as group:
            for job in jobs:
                group.create_task(one(job))


def _jobs(pending: Sequence[WorkItem], rows: dict[int, DatasetRow], bridges: _Bridges) -> list[Job]:
    return [
        Job(
            item=item,
            rollout_id=f"eval-{item.model}-{item.row}-{item.sample}-{secrets.token_hex(4)}",
            row=rows[item.row],
            metadata={"row_index": item.row, "sample_index": item.sample},
            bridge=bridges.by_model[item.model],
        )
        for item in pending
    ]


def _stop_on_signals() -> None:
    """SIGTERM (a supervisor's stop) ends the run as Ctrl-C does: what finished is kept. So
    does SIGINT when this process inherited it ignored (started in the background by a
    script), where asyncio would not catch it."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    if task is None:
        return
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signals.append(signal.SIGINT)

    def stop() -> None:  # once: a second cancel would cut the clean-up short
        for signum in signals:
            loop.remove_signal_handler(signum)
        task.cancel()

    for signum in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop)


def summarise(run: RunDirectory, plan: RunPlan, title: str) -> EvalMetrics:
    """Write ``metrics.json`` and ``report.html`` from the results so far."""
    results = run.results(plan)
    grouped = by_model(results)
    per_model = len(plan.rows) * plan.n
    metrics = EvalMetrics(
        complete=len(results) == len(plan.items()),
        n=plan.n,
        pass_threshold=plan.pass_threshold,
        models={
            name: model_metrics(grouped.get(name, []), per_model, plan.n, plan.pass_threshold)
            for name in plan.models
        },
    )
    run.write_json(METRICS_FILE, metrics.model_dump(mode="json"))
    run.write_text(REPORT_FILE, render(title, metrics, results))
    return metrics


def summary_table(metrics: EvalMetrics, plan: RunPlan) -> Table:
    table = Table(title=f"n = {plan.n}, pass threshold {plan.pass_threshold:g}")
    columns = ["model", "finished", "mean reward", "pass rate", "pass@1", f"pass@{plan.n}"]
    for column in [*columns, "failed", "p50 / p99 ms", "tokens"]:
        table.add_column(column)
    for name, figures in metrics.models.items():

        def share(value: float | None) -> str:
            return "–" if value is None else f"{value:.1%}"

        table.add_row(
            f"{name} ({plan.models[name]})",
            f"{figures.finished}/{figures.items}",
            "–" if figures.mean_reward is None else f"{figures.mean_reward:.3f}",
            share(figures.pass_rate),
            share(figures.pass_at_1),
            share(figures.pass_at_n),
            str(figures.failed),
            f"{figures.latency_ms.p50:.0f} / {figures.latency_ms.p99:.0f}",
            str(figures.tokens.total),
        )
    return table


async def run_eval(
    agent: Agent,
    config: EvalConfig,
    options: EvalOptions,
    executor: Executor,
    console: Console,
) -> EvalOutcome:
    name = options.name or default_name(config)
    if not RUN_NAME.match(name):
        raise EvalError(f"run name {name!r}: use letters, digits, '.', '_' and '-' (64 at most)")
    rows = _rows(agent, config, options)
    plan = _plan(config, options, sorted(rows))
    run = RunDirectory.open(options.output, name, plan, fresh=options.fresh)
    pending = run.pending(plan, retry_failed=options.retry_failed)
    endpoints = {"policy": config.model}
    if config.baseline is not None:
        endpoints["baseline"] = config.baseline
    console.print(
        f"run {name!r}: {len(plan.items())} work items, {len(pending)} to run → {run.path}"
    )
    interrupted = False
    _stop_on_signals()
    if pending:
        async with executor, _Bridges(endpoints) as bridges:
            await bridges.start(executor.bridge_host)
            jobs = _jobs(pending, rows, bridges)
            try:
                await _dispatch(jobs, executor, run, options, config.pass_threshold, console)
            except asyncio.CancelledError:  # Ctrl-C: keep what finished, say how to resume
                interrupted = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
    metrics = summarise(run, plan, f"Evaluation {name}")
    console.print(summary_table(metrics, plan))
    console.print(f"results: {run.path} (metrics.json, report.html)")
    if interrupted or not metrics.complete:
        console.print(f"[yellow]unfinished: run again with --name {name} to finish it[/]")
    return EvalOutcome(run.path, metrics, interrupted)


__all__ = [
    "EvalError",
    "EvalOptions",
    "EvalOutcome",
    "Executor",
    "Job",
    "default_name",
    "run_eval",
    "select_rows",
    "summarise",
]
