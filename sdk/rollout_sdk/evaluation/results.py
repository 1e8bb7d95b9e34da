"""Work items, their results, and the run directory that keeps them.

A run directory holds ``run.json`` (what was planned: agent, dataset, rows, n, models),
``results.jsonl`` (one line per finished work item, appended as each finishes) and, once the
run is summarised, ``metrics.json`` and ``report.html``. An item a stopped run cut off gets an
``unfinished`` line: it is no outcome (no figure counts it), only a note that it was under
way. A run started again under the same name runs the items without an outcome
(``--retry-failed``: also the failed ones; ``--fresh``: all of them again). A line cut short
by a kill is ignored: that item simply runs again.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

Model = Literal["policy", "baseline"]
Status = Literal["success", "failure", "unfinished"]
RUN_FILE, RESULTS_FILE = "run.json", "results.jsonl"
METRICS_FILE, REPORT_FILE = "metrics.json", "report.html"


EXCERPT_CHARS = 200  # of a prompt, label or answer kept with a result


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str | None:
    """``text`` on one line, cut to ``limit`` characters (``None`` stays ``None``)."""
    if text is None:
        return None
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass(frozen=True, order=True)
class WorkItem:
    """One rollout of an evaluation: a dataset row's ``sample``-th run with one model."""

    model: Model
    row: int
    sample: int

    @property
    def key(self) -> str:
        return f"{self.model}:{self.row}:{self.sample}"


class Tokens(BaseModel):
    prompt: int = 0
    completion: int = 0
    total: int = 0


class ItemResult(BaseModel):
    """A finished work item, as one line of ``results.jsonl``."""

    model: Model
    row: int
    sample: int
    rollout_id: str
    status: Status  # unfinished: cut off by a stop, runs again when the run is resumed
    reward: float | None = None  # the grader's (v2), the eval function's or the agent's (v1)
    passed: bool = False  # reward at or above the pass threshold
    scores: dict[str, float] = Field(default_factory=dict)  # per v1 eval function
    error: str | None = None
    error_category: str | None = None
    latency_ms: float = 0.0
    llm_calls: int = 0
    tokens: Tokens = Field(default_factory=Tokens)
    # Excerpts, so the report can show what was asked, expected and answered.
    prompt: str | None = None
    label: str | None = None
    answer: str | None = None

    @property
    def item(self) -> WorkItem:
        return WorkItem(self.model, self.row, self.sample)


class RunPlan(BaseModel):
    """What a run is made of; a run resumed under its name must have the same plan."""

    agent: str
    dataset: str
    rows: list[int]
    n: int
    models: dict[str, str]  # "policy"/"baseline" → model name
    pass_threshold: float
    eval_fns: list[str] = Field(default_factory=list)

    def items(self) -> list[WorkItem]:
        return [
            WorkItem(model, row, sample)  # type: ignore[arg-type]
            for model in self.models
            for row in self.rows
            for sample in range(self.n)
        ]


class RunMismatch(Exception):
    """A run of that name exists with another plan."""


def _read_results(path: Path) -> dict[str, ItemResult]:
    finished: dict[str, ItemResult] = {}
    if not path.is_file():
        return finished
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            result = ItemResult.model_validate_json(line)
        except ValidationError:
            continue  # a line cut short by a kill: the item runs again
        finished[result.item.key] = result
    return finished


class RunDirectory:
    """One named run's files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.results_path = path / RESULTS_FILE

    @classmethod
    def open(cls, root: Path, name: str, plan: RunPlan, *, fresh: bool = False) -> RunDirectory:
        """The run ``name`` under ``root``: made for ``plan``, or the earlier run of that name
        when its plan is the same (``fresh``: started over whatever it was)."""
        run = cls(root / name)
        plan_file = run.path / RUN_FILE
        if fresh and run.path.exists():
            shutil.rmtree(run.path)
        if plan_file.is_file():
            earlier = RunPlan.model_validate_json(plan_file.read_text(encoding="utf-8"))
            if earlier != plan:
                raise RunMismatch(
                    f"run {name!r} in {root} was made with another plan (agent, dataset, rows, "
                    "n, models or threshold); use --fresh to start it over, or another --name"
                )
        run.path.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(plan.model_dump_json(indent=2), encoding="utf-8")
        return run

    def finished(self) -> dict[str, ItemResult]:
        return _read_results(self.results_path)

    def pending(self, plan: RunPlan, *, retry_failed: bool = False) -> list[WorkItem]:
        """The items to run: without an outcome (none yet, or cut off), and the failed ones
        when ``retry_failed``."""
        rerun = {"unfinished", "failure"} if retry_failed else {"unfinished"}
        done = self.finished()
        return [
            item for item in plan.items() if item.key not in done or done[item.key].status in rerun
        ]

    def results(self, plan: RunPlan) -> list[ItemResult]:
        """The latest outcome of every planned item that has one, in plan order (an item cut
        off has none)."""
        done = self.finished()
        return [
            done[item.key]
            for item in plan.items()
            if item.key in done and done[item.key].status != "unfinished"
        ]

    def mark_unfinished(self, cut_off: Iterable[tuple[WorkItem, str]]) -> int:
        """An ``unfinished`` line per (item, rollout id) a stop cut off. Written at once, not
        in a thread: the run is stopping and its loop may not turn again."""
        lines = [
            ItemResult(
                model=item.model,
                row=item.row,
                sample=item.sample,
                rollout_id=rollout_id,
                status="unfinished",
            ).model_dump_json()
            + "\n"
            for item, rollout_id in cut_off
        ]
        if lines:
            with self.results_path.open("a", encoding="utf-8") as results:
                results.write("".join(lines))
        return len(lines)

    async def append(self, result: ItemResult) -> None:
        line = result.model_dump_json() + "\n"

        def write() -> None:
            with self.results_path.open("a", encoding="utf-8") as results:
                results.write(line)

        await asyncio.to_thread(write)

    def write_json(self, name: str, value: Any) -> Path:
        path = self.path / name
        path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.path / name
        path.write_text(text, encoding="utf-8")
        return path


Verdict = Literal["wrong", "failed", "passed"]
VERDICT_ORDER: dict[Verdict, int] = {"wrong": 0, "failed": 1, "passed": 2}


def verdict(result: ItemResult) -> Verdict:
    """``passed``: reward at or above the threshold; ``wrong``: completed, reward below it;
    ``failed``: did not complete (no reward to judge)."""
    if result.passed:
        return "passed"
    return "failed" if result.status == "failure" else "wrong"


def worst_first(results: Iterable[ItemResult]) -> list[ItemResult]:
    """Wrong answers first (a completed rollout that missed is what a person looks for),
    then failures, then passes; each by row and sample."""
    return sorted(results, key=lambda r: (VERDICT_ORDER[verdict(r)], r.model, r.row, r.sample))


def by_model(results: Iterable[ItemResult]) -> dict[str, list[ItemResult]]:
    grouped: dict[str, list[ItemResult]] = {}
    for result in results:
        grouped.setdefault(result.model, []).append(result)
    return grouped


__all__ = [
    "METRICS_FILE",
    "REPORT_FILE",
    "ItemResult",
    "Model",
    "RunDirectory",
    "RunMismatch",
    "RunPlan",
    "Status",
    "Tokens",
    "Verdict",
    "WorkItem",
    "by_model",
    "excerpt",
    "verdict",
    "worst_first",
]
