"""Request bodies for the benchmark's workloads, built with the protocol's own models."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from rollout_sdk.core.schemas import RolloutRequest
from rollout_sdk.types import RolloutInitRequest

REPO = Path(__file__).resolve().parent.parent
CALCULATOR_ROWS = REPO / "examples/calculator/test_data.jsonl"
MULTIPLY_ROWS = REPO / "examples/strands_multiply/test_data.jsonl"


def _rows(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _id(label: str, index: int) -> str:
    return f"{label}-{index}-{uuid.uuid4().hex[:8]}"


def v1_bodies(trainer: str, count: int, label: str = "calc") -> list[RolloutRequest]:
    """Calculator rows as ``POST /v1/rollout/init`` bodies."""
    rows = _rows(CALCULATOR_ROWS)
    return [
        RolloutRequest(
            rollout_id=_id(label, i),
            server_url=trainer,
            messages=[
                {"role": "system", "content": row["system_prompt"]},
                {"role": "user", "content": row["user_prompt"]},
            ],
            completion_params={"temperature": 0.7, "max_tokens": 256},
            metadata={"ground_truth": row["ground_truth"]},
        )
        for i, row in ((i, rows[i % len(rows)]) for i in range(count))
    ]


def earlier_turns(count: int) -> list[dict[str, str]]:
    """``count`` messages of an earlier conversation (about 300 characters each)."""
    return [
        {
            "role": "user" if turn % 2 == 0 else "assistant",
            "content": f"Turn {turn}: " + "the product of 12 and 34 is 408; " * 9,
        }
        for turn in range(count)
    ]


def v2_bodies(
    trainer: str, count: int, label: str = "v2", history: int = 0
) -> list[RolloutInitRequest]:
    """Multiply rows as ``POST /rollout`` bodies, each with its own TrainGate URL, after
    ``history`` earlier messages."""
    rows = _rows(MULTIPLY_ROWS)
    bodies = []
    for i in range(count):
        row = rows[i % len(rows)]
        rollout_id = _id(label, i)
        bodies.append(
            RolloutInitRequest(
                rollout_id=rollout_id,
                initial_messages=[
                    {"role": "system", "content": row["system_prompt"]},
                    *earlier_turns(history),
                    {"role": "user", "content": row["user_prompt"]},
                ],
                chat_completions_url=f"{trainer}/v1/rollouts/{rollout_id}",
                llm_api_key=f"key-{rollout_id}",
                label=row["ground_truth"],
            )
        )
    return bodies
