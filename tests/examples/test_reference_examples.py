"""The seed documents' v1 examples run on the fleet unmodified, through the
``osmosis_ai`` import alias (shared/reference/000 and 001, read from there by
tests/seed_examples.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import StartFleet
from tests.harness import CALCULATOR_DATASET, new_id
from tests.seed_examples import requires_seed_documents

pytestmark = requires_seed_documents


@pytest.fixture(scope="module")
def agent(seed_examples: dict[str, Path]) -> dict[str, str]:
    return {
        document: f"{seed_examples[f'{document}_server.py']}:agent_loop"
        for document in ("000", "001")
    }


def dataset() -> list[dict[str, str]]:
    return [json.loads(line) for line in CALCULATOR_DATASET.read_text().splitlines()]


def test_the_complete_example_of_000_earns_reward_1_on_correct_answers(
    start_fleet: StartFleet, agent: dict[str, str]
) -> None:
    fleet = start_fleet(agent["000"], workers=1)
    try:
        bodies = [
            fleet.body(
                new_id("ref000"),
                messages=[
                    {"role": "system", "content": row["system_prompt"]},
                    {"role": "user", "content": row["user_prompt"]},
                ],
                metadata={"ground_truth": row["ground_truth"]},
            )
            for row in dataset()
        ]
        wrong = fleet.body(
            new_id("ref000"),
            messages=[{"role": "user", "content": "What is 2 + 2?"}],
            metadata={"ground_truth": "5"},
        )
        responses = [fleet.init(body) for body in [*bodies, wrong]]
        assert {r.status_code for r in responses} == {202}
        assert [t["function"]["name"] for t in responses[0].json()["tools"]] == ["add", "multiply"]
        deliveries = fleet.wait_delivered([b["rollout_id"] for b in [*bodies, wrong]])
        for body in bodies:
            (done,) = deliveries[body["rollout_id"]]
            assert done["status"] == "COMPLETED"
            assert done["reward"] == 1.0
            assert done["metrics"]["num_tool_calls"] >= 1
        assert deliveries[wrong["rollout_id"]][0]["reward"] == 0.0
    finally:
        fleet.close()


def test_the_quick_start_snippet_of_001_runs(
    start_fleet: StartFleet, agent: dict[str, str]
) -> None:
    fleet = start_fleet(agent["001"], workers=1)
    try:
        body = fleet.body(messages=[{"role": "user", "content": "What is 12 * 8?"}])
        assert fleet.init(body).status_code == 202
        (done,) = fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]
        assert done["status"] == "COMPLETED"
        assert done["final_messages"][-1]["content"] == "#### 96"
        assert "reward" not in done  # the snippet's compute_reward(...) placeholder
    finally:
        fleet.close()
