"""The framework-free v2 example (examples/plain_v2_calculator, the one docs/WRITE-YOUR-AGENT.md
shows) end to end: ``rollout-sdk validate``, ``rollout-sdk test`` against the mock TrainGate,
and rollouts on a real fleet (redis-server, two gateways, Celery workers) through a trainer
client, with the rewards its grader gives, the calls ``rollout_client`` makes as the guide
says (URL, headers, token-id fields, tools) and the turns ``rollout-fleet export`` keeps."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import REPO, MockTrainGateClient, V2FleetUnderTest, exported, run_v2_dataset

EXAMPLE = REPO / "examples" / "plain_v2_calculator"
ROWS = len((EXAMPLE / "test_data.jsonl").read_text().splitlines())


def sdk_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_sdk.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_validate_names_the_workflow_and_the_grader() -> None:
    done = sdk_cli("validate", "-m", "examples/plain_v2_calculator/main.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "Agent workflow 'plain-calculator' validated successfully.",
        "  - Workflow: CalculatorWorkflow",
        "  - Grader: ExactAnswerGrader",
    ]


def test_every_row_earns_its_reward_against_the_mock_traingate(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    out = tmp_path / "rows.jsonl"
    done = sdk_cli(
        "test", "-m", "examples/plain_v2_calculator/main.py",
        "-d", "examples/plain_v2_calculator/test_data.jsonl",
        "--base-url", f"{mock_trainer.url}/v1/rollouts/plain-cli", "--model", "my-policy",
        "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["row_index"] for r in results] == list(range(ROWS))
    for result in results:
        assert (result["status"], result["reward"], result["error"]) == ("success", 1.0, None)
        assert result["llm_calls"] >= 2  # a tool call, then the answer
        assert result["messages"][-1]["content"].startswith("####")


@pytest.fixture(scope="module")
def fleet(start_fleet: StartFleet) -> Iterator[V2FleetUnderTest]:
    handle = start_fleet(
        str(EXAMPLE / "main.py"),
        workers=2,
        gateways=2,
        concurrency=50,
        handle=V2FleetUnderTest,
        env=V2_ENV,
    )
    assert isinstance(handle, V2FleetUnderTest)
    yield handle
    handle.close()


def test_rollouts_on_a_fleet_get_the_graders_rewards_and_keep_their_turns(
    fleet: V2FleetUnderTest, tmp_path: Path
) -> None:
    count = 40  # every 10th with a wrong label, which the grader must score 0
    results = asyncio.run(
        run_v2_dataset(fleet.fleet.gateway_url, fleet.trainer.url, EXAMPLE, count)
    )
    assert len(results) == count
    lines, _ = exported(fleet, tmp_path)
    for rollout_id, (result, label) in results.items():
        answer = result["sample"]["messages"][-1]["content"]
        assert result["status"] == "success", result
        assert result["sample"]["reward"] == (0.0 if label == "-1" else 1.0)
        assert answer.startswith("####")
        calls = fleet.trainer.calls("chat", rollout_id)
        assert calls, rollout_id
        for call in calls:
            assert call["path"] == f"/v1/rollouts/{rollout_id}/chat/completions"
            assert call["headers"]["authorization"] == f"Bearer key-{rollout_id}"
            assert call["headers"]["x-rollout-id"] == rollout_id
            assert call["headers"]["x-sample-id"] == "calculator"
            body = call["body"]
            assert body["model"] == "osmosis-rollout"
            assert not body.get("stream")
            assert (body["return_token_ids"], body["logprobs"]) == (True, True)
            assert [t["function"]["name"] for t in body["tools"]] == ["add", "multiply"]
        turns = lines[rollout_id]["turns"]
        assert len(turns) == len(calls)
        assert {turn["sample_id"] for turn in turns} == {"calculator"}
        assert all(turn["prompt_token_ids"] for turn in turns)
        assert len(turns[-1]["token_ids"]) == len(answer)  # the mock's tokens for its answer
