"""What a finished run prints: its figures, its failures grouped by category (with the first
error of each) and its rows, wrong answers first.

Made to be read in an 80-column terminal: the figures table has one column per model (not
per figure), and the rows table keeps its short columns whole and cuts only the excerpts.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from rollout_sdk.evaluation.metrics import EvalMetrics, ModelMetrics
from rollout_sdk.evaluation.results import ItemResult, RunPlan, verdict, worst_first
from rollout_sdk.terminal import as_data

TERMINAL_ROWS = 20  # the rest are in report.html
VERDICT_STYLE = {"wrong": "yellow", "failed": "red", "passed": "green"}


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _figures(figures: ModelMetrics, model: str, n: int) -> list[str]:
    return [
        model,
        f"{figures.finished}/{figures.items}",
        f"{figures.succeeded}",
        f"{figures.finished - figures.failed - figures.wrong}",
        f"{figures.wrong}",
        f"{figures.failed}",
        "–" if figures.mean_reward is None else f"{figures.mean_reward:.3f}",
        _share(figures.pass_rate),
        _share(figures.pass_at_1),
        _share(figures.pass_at_n),
        f"{figures.latency_ms.p50:.0f} / {figures.latency_ms.p99:.0f}",
        str(figures.tokens.total),
    ]


def figures_table(metrics: EvalMetrics, plan: RunPlan) -> Table:
    """One row per figure, one column per model."""
    labels = [
        "model",
        "finished",
        "completed",
        "passed (reward ≥ threshold)",
        "wrong (completed, below)",
        "failed (did not complete)",
        "mean reward",
        "pass rate",
        "pass@1",
        f"pass@{plan.n}",
        "latency p50 / p99 ms",
        "tokens",
    ]
    table = Table(title=f"n = {plan.n}, pass threshold {plan.pass_threshold:g}", box=box.SIMPLE)
    table.add_column("figure", no_wrap=True)
    columns = [
        _figures(figures, plan.models[name], plan.n) for name, figures in metrics.models.items()
    ]
    for name in metrics.models:
        table.add_column(name, overflow="fold")
    for index, label in enumerate(labels):
        table.add_row(label, *(column[index] for column in columns))
    return table


def failure_lines(metrics: EvalMetrics) -> list[Text]:
    """Per model and category: how many failed, and the first one's error (as data: an
    error may quote what an endpoint or agent said)."""
    lines = []
    for name, figures in metrics.models.items():
        for category, count in sorted(figures.failures_by_category.items()):
            first = figures.first_errors.get(category, "")
            lines.append(as_data(f"{name}: {count} × {category}: {first}"))
    return lines


def rows_table(results: Sequence[ItemResult], limit: int = TERMINAL_ROWS) -> Table | None:
    """The first ``limit`` rows, wrong answers first; ``None`` when there are none."""
    if not results:
        return None
    ordered = worst_first(results)
    several_models = len({r.model for r in results}) > 1
    shown = len(ordered[:limit])
    title = f"rows ({shown} of {len(ordered)}, wrong answers first)"
    table = Table(title=title, box=box.SIMPLE, pad_edge=False)
    table.add_column("row", no_wrap=True, min_width=3)
    table.add_column("verdict", no_wrap=True, min_width=7)
    table.add_column("reward", no_wrap=True, justify="right", min_width=6)
    table.add_column("ms", no_wrap=True, justify="right", min_width=4)
    for header, ratio in (("prompt", 3), ("label", 1), ("answer", 3)):
        table.add_column(header, no_wrap=True, overflow="ellipsis", min_width=6, ratio=ratio)
    for result in ordered[:limit]:
        judged = verdict(result)
        where = f"{result.row}.{result.sample}"
        answer = result.answer or result.error or ""
        table.add_row(
            f"{result.model[0]}{where}" if several_models else where,
            Text(judged, style=VERDICT_STYLE[judged]),
            "–" if result.reward is None else f"{result.reward:g}",
            f"{result.latency_ms:.0f}",
            as_data(result.prompt),
            as_data(result.label),
            as_data(answer),
        )
    return table


__all__ = ["failure_lines", "figures_table", "rows_table"]
