"""An evaluation run: plan the work items, run the pending ones through an executor, keep
each result as it comes, then write ``metrics.json`` and ``report.html`` and print a summary.

Stopped (Ctrl-C, SIGTERM), a run keeps what finished, notes the items it cut off as
``unfinished`` (no outcome: they run again, and no figure counts them), and prints one line
with the command that resumes it: the same command with the same ``--name`` runs only the
rest. Before it starts anything, it probes each model endpoint (:mod:`.probe`).
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

from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.evaluation.config import EvalConfig, ModelEndpoint
from rollout_sdk.evaluation.listen import BridgeHostError, Listening, bridge_address
from rollout_sdk.evaluation.metrics import EvalMetrics, model_metrics
from rollout_sdk.evaluation.probe import EndpointDown, probe_endpoints
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
    excerpt,
)
from rollout_sdk.evaluation.scoring import EvalFn, EvalFnError, last_assistant_text
from rollout_sdk.evaluation.summary import failure_lines, figures_table, rows_table
from rollout_sdk.loader import Agent
from rollout_sdk.localrun.bridge import LLMBridge
from rollout_sdk.localrun.dataset import DatasetError, DatasetRow, read_rows, v1_row, v2_row
from rollout_sdk.localrun.runner import RowResult

RETRY_FAILED = "--retry-failed"
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
    def default_in_flight(self) -> int:
        """Jobs at once unless the run says."""
        ...

    @property
    def where(self) -> str:
        """Where the jobs run, as the run says it: "in this process", "on the fleet at URL"."""
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
    again: str = "the same command"  # the command line that runs this run again


@dataclass(frozen=True)
class EvalOutcome:
    directory: Path
    metrics: EvalMetrics
    interrupted: bool
    stopped_early: str | None = None  # why items were left unstarted (the endpoint failed)

    @property
    def every_item_failed(self) -> bool:
        figures = self.metrics.models.values()
        finished = sum(m.finished for m in figures)
        return finished > 0 and sum(m.failed for m in figures) == finished


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
        prompt=excerpt(job.row.user_prompt),
        label=excerpt(job.row.ground_truth),
        answer=excerpt(last_assistant_text(outcome.messages)) or None,
    )


class _Bridges:
    """One local TrainGate per model of the run, each taking only calls with its own key."""

    def __init__(self, endpoints: dict[str, ModelEndpoint]) -> None:
        self.by_model = {
            name: LLMBridge(
                endpoint.base_url, endpoint.model, endpoint.api_key, key=secrets.token_urlsafe(32)
            )
            for name, endpoint in endpoints.items()
        }

    @property
    def fatal(self) -> str | None:
        """Why the endpoint of a model can serve no more calls (unreachable, key, quota)."""
        return next((b.fatal for b in self.by_model.values() if b.fatal is not None), None)

    async def __aenter__(self) -> _Bridges:
        return self

    async def start(self, host: str) -> None:
        for bridge in self.by_model.values():
            try:
                await bridge.start(host)
            except OSError as exc:
                raise EvalError(
                    f"the model bridge cannot listen on {host}: {exc.strerror or exc}"
                ) from None

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        for bridge in self.by_model.values():  # stopping: calls under way are dropped
            await bridge.stop(force=kind is not None)


class Stop:
    """SIGINT and SIGTERM end a run the same way: the run's task is cancelled once (a second
    cancel would cut the clean-up short; later signals are ignored), what finished is kept,
    the items under way are noted unfinished. Set on the loop for SIGINT too: a process
    started in the background by a script inherits SIGINT ignored."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._task: asyncio.Task[Any] | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def install(self) -> None:
        loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._received, signum)

    def _received(self, signum: int) -> None:
        if self.signal is None and self._task is not None:
            self.signal = signal.Signals(signum).name
            self._task.cancel()

    def settle(self) -> None:
        """The stop is handled: the run's task goes on (to write its files) uncancelled."""
        if self._task is not None:
            self._task.uncancel()


# How long jobs cut off by a stop get to end before the run stops waiting for them.
STOP_WAIT_SECONDS = 1.0


@dataclass
class _Tally:
    passed: int = 0
    failed: int = 0
    in_flight: dict[str, Job] = field(default_factory=dict)


async def _dispatch(
    jobs: list[Job],
    executor: Executor,
    run: RunDirectory,
    options: EvalOptions,
    threshold: float,
    console: Console,
    bridges: _Bridges,
) -> None:
    """Every job, at most the in-flight limit at once. Once a model endpoint fails for good
    no more jobs start (they stay pending). Cancelled (a stop), the jobs under way are
    cancelled, given :data:`STOP_WAIT_SECONDS`, and noted unfinished."""
    slots = asyncio.Semaphore(options.max_in_flight or executor.default_in_flight)
    columns: list[Any] = [
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("passed {task.fields[passed]} · failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    ]
    tally = _Tally()
    with Progress(*columns, console=console, disable=options.quiet) as progress:
        bar = progress.add_task("rollouts", total=len(jobs), passed=0, failed=0)

        async def one(job: Job) -> None:
            async with slots:
                if bridges.fatal is not None:
                    return
                tally.in_flight[job.rollout_id] = job
                outcome = await executor.run(job)
            job.bridge.forget(job.rollout_id)
            result = await _scored(job, outcome, options, threshold)
            del tally.in_flight[job.rollout_id]
            await run.append(result)
            tally.passed += result.passed
            tally.failed += result.status == "failure"
            progress.update(bar, advance=1, passed=tally.passed, failed=tally.failed)

        tasks = [asyncio.create_task(one(job)) for job in jobs]
        try:
            for finished in asyncio.as_completed(tasks):
                await finished  # the first error (a bug, not an item's failure) ends the run
        except BaseException:
            for task in tasks:
                task.cancel()
            # A job that swallows its cancel (an agent's own except clause) is not waited for.
            await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
            run.mark_unfinished((job.item, job.rollout_id) for job in tally.in_flight.values())
            raise


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


def _print_summary(
    console: Console, run: RunDirectory, plan: RunPlan, metrics: EvalMetrics, again: str
) -> None:
    console.print(figures_table(metrics, plan))
    for line in failure_lines(metrics):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    table = rows_table(run.results(plan))
    if table is not None:
        console.print(table)
    console.print(f"results: {run.path} (metrics.json, report.html)", soft_wrap=True)
    failed = sum(figures.failed for figures in metrics.models.values())
    if not metrics.complete:
        console.print(f"[yellow]unfinished; finish it with:[/] {again}", soft_wrap=True)
    if failed:
        retry = again if RETRY_FAILED in again.split() else f"{again} {RETRY_FAILED}"
        console.print(
            f"{failed} failed; run them again with: {retry}",
            markup=False,
            soft_wrap=True,
        )


async def run_eval(
    agent: Agent,
    config: EvalConfig,
    options: EvalOptions,
    executor: Executor,
    console: Console,
) -> EvalOutcome:
    """Plan, probe the endpoints, run what is pending, summarise. :class:`EvalError` (with
    its one line) when the run cannot start."""
    name = options.name or default_name(config)
    if not RUN_NAME.match(name):
        raise EvalError(f"run name {name!r}: use letters, digits, '.', '_' and '-' (64 at most)")
    try:
        listening = bridge_address(agent, config.fleet.bridge_host)
    except BridgeHostError as exc:
        raise EvalError(str(exc)) from None
    rows = _rows(agent, config, options)
    plan = _plan(config, options, sorted(rows))
    run = RunDirectory.open(options.output, name, plan, fresh=options.fresh)
    pending = run.pending(plan, retry_failed=options.retry_failed)
    endpoints = {"policy": config.model}
    if config.baseline is not None:
        endpoints["baseline"] = config.baseline
    console.print(
        f"run {name!r}: {len(plan.items())} work items, {len(pending)} to run → {run.path}",
        soft_wrap=True,
    )
    stop = Stop()
    stop.install()
    fatal: str | None = None
    try:
        if pending:
            await probe_endpoints(endpoints)
            # Left in this order: a stopped fleet makes no more calls to the bridges.
            async with _Bridges(endpoints) as bridges:
                await bridges.start(listening.host)  # before the fleet: it may not listen
                if listening.why is not None:
                    console.print(_listening_line(bridges, listening), soft_wrap=True)
                async with executor:
                    console.print(f"running {executor.where}", soft_wrap=True, highlight=False)
                    jobs = _jobs(pending, rows, bridges)
                    await _dispatch(
                        jobs, executor, run, options, config.pass_threshold, console, bridges
                    )
                    fatal = bridges.fatal
    except EndpointDown as exc:
        raise EvalError(str(exc)) from None
    except asyncio.CancelledError:
        if not stop.requested:
            raise
        stop.settle()
        metrics = summarise(run, plan, f"Evaluation {name}")
        console.print(_stopped_line(stop, run, plan, metrics, options.again), soft_wrap=True)
        return EvalOutcome(run.path, metrics, interrupted=True)
    metrics = summarise(run, plan, f"Evaluation {name}")
    _print_summary(console, run, plan, metrics, options.again)
    return EvalOutcome(run.path, metrics, interrupted=False, stopped_early=fatal)


def _listening_line(bridges: _Bridges, listening: Listening) -> str:
    urls = ", ".join(bridge.url for bridge in bridges.by_model.values())
    return (
        f"model bridge on {urls} ({listening.why}); it takes only this run's rollouts, "
        "which carry its key"
    )


def _stopped_line(
    stop: Stop, run: RunDirectory, plan: RunPlan, metrics: EvalMetrics, again: str
) -> str:
    finished = sum(figures.finished for figures in metrics.models.values())
    if not finished:
        return f"stopped ({stop.signal}) before any item finished; run it with: {again}"
    remaining = len(run.pending(plan))
    return (
        f"stopped ({stop.signal}): {finished} of {len(plan.items())} items done, "
        f"{remaining} to run; resume with: {again}"
    )


__all__ = [
    "EvalError",
    "EvalOptions",
    "EvalOutcome",
    "Executor",
    "Job",
    "Stop",
    "default_name",
    "run_eval",
    "select_rows",
    "summarise",
]
