"""The evaluation's figures against values worked out by hand (no processes)."""

from __future__ import annotations

import math

import pytest

from rollout_sdk.evaluation.metrics import model_metrics, pass_at_k, percentile
from rollout_sdk.evaluation.results import ItemResult


def result(row: int, sample: int, reward: float | None, *, failed: bool = False) -> ItemResult:
    return ItemResult(
        model="policy",
        row=row,
        sample=sample,
        rollout_id=f"r{row}-{sample}",
        status="failure" if failed else "success",
        reward=reward,
        passed=not failed and reward is not None and reward >= 1.0,
        error_category="agent_error" if failed else None,
        latency_ms=float(10 * (row + 1) + sample),
    )


def test_pass_at_k_is_the_unbiased_estimate() -> None:
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(4, 2, 3) == 1.0  # any 3 of 4 include one of the 2 passes


def test_figures_by_hand() -> None:
    """Row 0 passes 2 of 4 samples, row 1 none (one failed), row 2 all four."""
    results = [result(0, s, 1.0 if s < 2 else 0.0) for s in range(4)]
    results += [result(1, 0, None, failed=True)] + [result(1, s, 0.0) for s in range(1, 4)]
    results += [result(2, s, 1.0) for s in range(4)]
    figures = model_metrics(results, planned=12, n=4, threshold=1.0)
    assert (figures.finished, figures.succeeded, figures.failed) == (12, 11, 1)
    assert figures.mean_reward == pytest.approx(6 / 12)
    assert figures.pass_rate == pytest.approx(6 / 12)
    assert figures.pass_at_1 == pytest.approx((2 / 4 + 0 + 1) / 3)
    row0_at_2 = 1 - math.comb(2, 2) / math.comb(4, 2)
    assert figures.pass_at_k[2] == pytest.approx((row0_at_2 + 0 + 1) / 3, abs=1e-6)
    assert figures.pass_at_n == pytest.approx(2 / 3)
    assert figures.failures_by_category == {"agent_error": 1}
    assert figures.latency_ms.max == 33.0


def test_percentiles_interpolate() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 0.5) == 25.0
    assert percentile([1.0, 2.0, 3.0], 0.99) == pytest.approx(2.98)
