"""Eval functions the evaluation tests score with, one per signature style."""

from __future__ import annotations

from typing import Any

from rollout_sdk.core.schemas import MessageDict


def exact(solution_str: str, ground_truth: str, extra_info: dict[str, Any]) -> float:
    """1.0 when the final answer is ``#### <ground truth>``."""
    return 1.0 if solution_str.strip() == f"#### {ground_truth}" else 0.0


def even_samples(messages: list[MessageDict], ground_truth: str, metadata: dict[str, Any]) -> float:
    """Right answers pass on even samples only: rows pass some samples and not others, so
    pass@1 and pass@n differ by a known amount."""
    answer = str(messages[-1].get("content") or "").strip() if messages else ""
    right = answer == f"#### {ground_truth}"
    return 1.0 if right and metadata["sample_index"] % 2 == 0 else 0.0
