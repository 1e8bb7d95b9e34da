"""An evaluation's figures, per model: reward, pass rates, pass@k, failures, latency, tokens.

* ``succeeded`` (completed), ``failed`` (did not complete) and ``wrong`` (completed with a
  reward below the threshold); an item a stopped run cut off is no outcome and counts nowhere.
* ``failures_by_category`` and, per category, ``first_errors``: the first failure's message.
* ``mean_reward``: over every finished item; an item without a reward (a failed rollout)
  counts as 0, since it earned nothing.
* ``pass_rate``: the share of finished items whose reward reached the pass threshold.
* ``pass_at_k``: per row, the unbiased estimate ``1 - C(m - c, k) / C(m, k)`` of at least one
  pass among ``k`` of its ``m`` finished samples, ``c`` of which passed; averaged over the rows
  with at least ``k`` samples. ``pass@1`` is the mean per-row pass share; ``pass@n`` the share
  of rows with a pass among all ``n`` samples.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, Field

from rollout_sdk.evaluation.results import ItemResult


class Latency(BaseModel):
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0


class TokenTotals(BaseModel):
    prompt: int = 0
    completion: int = 0
    total: int = 0
    mean_per_item: float = 0.0


class FunctionScores(BaseModel):
    mean: float
    pass_rate: float


class ModelMetrics(BaseModel):
    items: int  # planned
    finished: int
    succeeded: int
    failed: int
    wrong: int = 0  # completed, reward below the threshold
    mean_reward: float | None
    pass_rate: float | None
    pass_at_1: float | None
    pass_at_n: float | None
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    failures_by_category: dict[str, int] = Field(default_factory=dict)
    first_errors: dict[str, str] = Field(default_factory=dict)  # category → its first error
    latency_ms: Latency = Field(default_factory=Latency)
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    eval_fns: dict[str, FunctionScores] = Field(default_factory=dict)


class EvalMetrics(BaseModel):
    """``metrics.json``."""

    complete: bool  # every planned item finished
    n: int
    pass_threshold: float
    models: dict[str, ModelMetrics]


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between the closest ranks (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def pass_at_k(samples: int, passes: int, k: int) -> float:
    """The chance that at least one of ``k`` samples drawn from ``samples`` passes."""
    if samples - passes < k:
        return 1.0
    return 1.0 - math.comb(samples - passes, k) / math.comb(samples, k)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _pass_curve(results: Sequence[ItemResult], n: int) -> dict[int, float]:
    per_row: dict[int, list[bool]] = defaultdict(list)
    for result in results:
        per_row[result.row].append(result.passed)
    curve = {}
    for k in range(1, n + 1):
        rows = [pass_at_k(len(p), sum(p), k) for p in per_row.values() if len(p) >= k]
        if rows:
            curve[k] = sum(rows) / len(rows)
    return curve


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def model_metrics(
    results: Sequence[ItemResult], planned: int, n: int, threshold: float
) -> ModelMetrics:
    latencies = [result.latency_ms for result in results]
    curve = _pass_curve(results, n)
    tokens = TokenTotals(
        prompt=sum(r.tokens.prompt for r in results),
        completion=sum(r.tokens.completion for r in results),
        total=sum(r.tokens.total for r in results),
    )
    tokens.mean_per_item = round(tokens.total / len(results), 3) if results else 0.0
    functions = sorted({name for result in results for name in result.scores})
    failures = [r for r in results if r.status == "failure"]
    first_errors: dict[str, str] = {}
    for failure in failures:
        first_errors.setdefault(failure.error_category or "unknown", failure.error or "no message")
    return ModelMetrics(
        items=planned,
        finished=len(results),
        succeeded=sum(r.status == "success" for r in results),
        failed=len(failures),
        wrong=sum(r.status == "success" and not r.passed for r in results),
        mean_reward=_rounded(_mean([r.reward or 0.0 for r in results])),
        pass_rate=_rounded(_mean([float(r.passed) for r in results])),
        pass_at_1=_rounded(curve.get(1)),
        pass_at_n=_rounded(curve.get(n)),
        pass_at_k={k: round(v, 6) for k, v in curve.items()},
        failures_by_category=dict(Counter(r.error_category or "unknown" for r in failures)),
        first_errors=first_errors,
        latency_ms=Latency(
            mean=round(_mean(latencies) or 0.0, 1),
            p50=round(percentile(latencies, 0.5), 1),
            p90=round(percentile(latencies, 0.9), 1),
            p99=round(percentile(latencies, 0.99), 1),
            max=round(max(latencies, default=0.0), 1),
        ),
        tokens=tokens,
        eval_fns={
            name: FunctionScores(
                mean=round(sum(r.scores.get(name, 0.0) for r in results) / len(results), 6),
                pass_rate=round(
                    sum(r.scores.get(name, 0.0) >= threshold for r in results) / len(results), 6
                ),
            )
            for name in functions
        },
    )


__all__ = ["EvalMetrics", "ModelMetrics", "model_metrics", "pass_at_k", "percentile"]
