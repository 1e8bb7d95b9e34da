"""The calculator's reward: 1.0 when the final answer (after ``####``) matches the truth."""

from __future__ import annotations

import re
from typing import Any

from rollout_sdk import osmosis_reward

ANSWER = re.compile(r"####\s*(-?[\d.,]+)")


def extract_answer(text: str) -> str | None:
    match = ANSWER.search(text)
    return match.group(1).replace(",", "").rstrip(".") if match else None


@osmosis_reward
def compute_reward(
    solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> float:
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    try:
        return 1.0 if abs(float(answer) - float(ground_truth)) < 1e-6 else 0.0
    except ValueError:
        return 0.0
