"""CONFORMANCE §P (the LLM side, P§2.11): the bundled Strands and OpenAI
Agents examples on the fleet — 200 rollouts each through a trainer client, correct rewards,
and every LLM call checked at the mock TrainGate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import REPO, V2FleetUnderTest, new_id, run_v2_dataset

EXAMPLES = {
    "strands": REPO / "examples/strands_multiply",
    "openai_agents": REPO / "examples/openai_agents_multiply",
}


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def framework(
    request: pytest.FixtureRequest, start_fleet: StartFleet
) -> Iterator[tuple[str, V2FleetUnderTest]]:
    handle = start_fleet(
        str(EXAMPLES[request.param] / "main.py"),
        workers=2,
        gateways=2,
        concurrency=100,
        handle=V2FleetUnderTest,
        env=V2_ENV,
    )
    assert isinstance(handle, V2FleetUnderTest)
    yield request.param, handle
    handle.close()


def test_200_rollouts_with_correct_rewards_and_well_formed_llm_calls(
    framework: tuple[str, V2FleetUnderTest],
) -> None:
    name, fleet = framework
    results = asyncio.run(
        run_v2_dataset(fleet.fleet.gateway_url, fleet.trainer.url, EXAMPLES[name], 200)
    )
    assert len(results) == 200
    for rollout_id, (result, label) in results.items():
        assert result["status"] == "success", result
        assert result["sample"]["reward"] == (0.0 if label == "-1" else 1.0)
        calls = fleet.trainer.calls("chat", rollout_id)
        assert len(calls) == 2  # one turn asking for the tool, one answering (item 127)
        for call in calls:
            assert call["path"] == f"/v1/rollouts/{rollout_id}/chat/completions"  # item 123
            assert call["headers"]["authorization"] == f"Bearer key-{rollout_id}"
            assert call["headers"]["x-rollout-id"] == rollout_id  # item 126
            assert call["headers"]["x-sample-id"] == "multiplier"
            assert call["body"]["stream"] is True
            assert [t["function"]["name"] for t in call["body"]["tools"]] == ["multiply"]  # 125


def test_127_a_killed_worker_never_leaves_two_executions_running(
    framework: tuple[str, V2FleetUnderTest],
) -> None:
    name, fleet = framework
    ids = [new_id(f"kill-{name}") for _ in range(20)]
    fleet.trainer.add_faults(
        *({"target": "chat", "delay_s": 1.0, "times": None, "rollout_id": i} for i in ids)
    )
    try:
        tokens = {}
        for rollout_id in ids:
            body = fleet.body(
                rollout_id,
                initial_messages=[{"role": "user", "content": "What is 7 * 6?"}],
                label="42",
            )
            tokens[rollout_id] = fleet.admit(body).json()["polling_lease_token"]
        records = {i: fleet.wait_status(i, {"running"}) for i in ids}
        victim = fleet.fleet.processes["worker-1"]
        doomed = [i for i, r in records.items() if f":{victim.pid}:" in r["execution"]]
        assert doomed
        time.sleep(0.5)
        victim.kill()
        finals = {i: fleet.result(i, tokens[i], timeout=90) for i in ids}
    finally:
        fleet.trainer.reset()
        fleet.fleet.start_worker(1)  # the module's other tests expect two workers
        fleet.fleet.wait_ready(60)
    assert all(final["status"] == "success" for final in finals.values())
    assert all(final["sample"]["reward"] == 1.0 for final in finals.values())
    for rollout_id in doomed:
        assert fleet.record(rollout_id)["attempt"] == "2"
