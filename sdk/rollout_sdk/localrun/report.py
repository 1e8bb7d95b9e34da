"""What a local run reports: a summary (completed, passed, reward, failures by category,
tokens) as a table, and the rows as a JSON report (SDK.md §1.15 ``-o``) or JSONL, one line
per row.

The words are ``eval run``'s: a row *completed* when its rollout ended without an error, and
*passed* when its reward reached the pass threshold; *failed* is a row that did not complete.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table

from rollout_sdk.localrun.runner import RowResult

# The spec's JSON report keeps these per row; JSONL keeps everything, messages included.
REPORT_FIELDS = (
    "row_index",
    "success",
    "error",
    "duration_ms",
    "token_usage",
    "reward",
    "finish_reason",
)


REPORT_SUMMARY_FIELDS = (
    "total",
    "completed",
    "passed",
    "failed",
    "pass_threshold",
    "total_duration_ms",
    "total_tokens",
)


def passes(result: RowResult, threshold: float) -> bool:
    """A row passed: it completed and its reward reached ``threshold``."""
    return result.success and result.reward is not None and result.reward >= threshold


@dataclass
class Summary:
    total: int
    completed: int  # ended without an error
    passed: int  # reward at or above the pass threshold
    failed: int  # did not complete
    pass_threshold: float
    reward_mean: float | None
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    total_duration_ms: float
    failures_by_category: dict[str, int] = field(default_factory=dict)
    stopped_early: str | None = None  # why the batch stopped before its last row

    @classmethod
    def of(
        cls,
        results: Sequence[RowResult],
        wall_ms: float,
        pass_threshold: float,
        stopped_early: str | None = None,
    ) -> Summary:
        rewards = [r.reward for r in results if r.reward is not None]
        usage = Counter[str]()
        for result in results:
            usage.update(result.token_usage)
        failures = Counter(r.error_category or "unknown" for r in results if not r.success)
        completed = sum(r.success for r in results)
        return cls(
            total=len(results),
            completed=completed,
            passed=sum(passes(r, pass_threshold) for r in results),
            failed=len(results) - completed,
            pass_threshold=pass_threshold,
            reward_mean=round(statistics.fmean(rewards), 4) if rewards else None,
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            total_tokens=usage["total_tokens"],
            total_duration_ms=round(wall_ms, 1),
            failures_by_category=dict(sorted(failures.items())),
            stopped_early=stopped_early,
        )

    def table(self) -> Table:
        table = Table(title="Summary", show_header=False)
        table.add_column("figure")
        table.add_column("value")
        table.add_row("rows", str(self.total))
        table.add_row("completed", str(self.completed))
        table.add_row(f"passed (reward ≥ {self.pass_threshold:g})", f"[green]{self.passed}[/green]")
        table.add_row(
            "failed (did not complete)", f"[red]{self.failed}[/red]" if self.failed else "0"
        )
        reward = "n/a" if self.reward_mean is None else f"{self.reward_mean:.4f}"
        table.add_row("reward mean", reward)
        for category, count in self.failures_by_category.items():
            table.add_row(f"failures: {category}", str(count))
        table.add_row(
            "tokens (prompt / completion / total)",
            f"{self.prompt_tokens} / {self.completion_tokens} / {self.total_tokens}",
        )
        table.add_row("duration", f"{self.total_duration_ms / 1000:.1f} s")
        if self.stopped_early:
            table.add_row("[red]stopped early[/red]", self.stopped_early)
        return table


def write_output(path: Path, results: Sequence[RowResult], summary: Summary) -> None:
    """``.jsonl``: one line per row (everything, messages included); otherwise the spec's
    JSON report ``{"summary": ..., "results": [...]}``."""
    if path.suffix == ".jsonl":
        lines = (json.dumps(result.as_dict(), default=str) for result in results)
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return
    report = {
        "summary": {
            key: value for key, value in asdict(summary).items() if key in REPORT_SUMMARY_FIELDS
        },
        "results": [
            {key: value for key, value in result.as_dict().items() if key in REPORT_FIELDS}
            for result in results
        ],
    }
    path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")


__all__ = ["Summary", "passes", "write_output"]
