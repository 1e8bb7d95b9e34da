"""The compose stack serving the bundled Strands example (v2), named in ``.env``
exactly as ``.env.example``'s v2 line suggests, runs v2 rollouts through the published
gateway port with one terminal result each, behind the server key."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import httpx
import pytest

from tests.docker.stack import Stack
from tests.harness import REPO, run_v2_dataset

ROLLOUTS = 30


@pytest.fixture(scope="module")
def stack_settings() -> dict[str, str]:
    """``# v2 examples: AGENT_DIR=./examples/strands_multiply AGENT=/agent/main.py``"""
    (line,) = re.findall(r"(?m)^# v2 examples: (.*)$", (REPO / ".env.example").read_text())
    return dict(pair.split("=", 1) for pair in line.split())


def test_v2_strands_rollouts_complete_with_one_terminal_result_each(stack: Stack) -> None:
    assert stack.trainer is not None
    ready = stack.ready()
    assert (ready["protocol"], ready["agent"], ready["workers"]) == ("v2", "strands-multiply", 2)
    assert httpx.get(f"{stack.gateway_url}/ready", timeout=30).status_code == 401  # server key

    results = asyncio.run(
        run_v2_dataset(
            stack.gateway_url,
            stack.trainer.url,
            REPO / "examples/strands_multiply",
            ROLLOUTS,
            api_key=stack.setting("ROLLOUT_FLEET_API_KEY"),
        )
    )
    assert len(results) == ROLLOUTS
    records = dict(zip(results, stack.records("v2", list(results)), strict=True))
    owners: Counter[str] = Counter()
    for rollout_id, (result, label) in results.items():
        assert result["status"] == "success", result
        assert result["sample"]["reward"] == (0.0 if label == "-1" else 1.0)
        record = records[rollout_id]
        assert (record["status"], record["terminations"]) == ("success", "1")
        owners[record["container"]] += 1
    assert "cannot create the artifacts directory" not in stack.logs("worker")  # uid 10001's home
    assert "?" not in owners
    assert len(owners) == 2, f"both worker replicas should have run rollouts: {owners}"
