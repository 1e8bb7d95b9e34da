"""CONFORMANCE §N — execution, grading and rewards (P§2.6, 2.9, 2.10) on the fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import v2_fleet
from tests.harness import V2FleetUnderTest

fleet = v2_fleet()
narrow = v2_fleet(gateways=1, workers=1, concurrency=1)


def run(
    fleet: V2FleetUnderTest,
    script: list[Any] | None = None,
    grader: list[Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Run one rollout; ``script``/``grader`` steer the scripted workflow and grader."""
    metadata = dict(fields.pop("metadata", None) or {})
    if script is not None:
        metadata["script"] = script
    if grader is not None:
        metadata["grade"] = grader
    return fleet.run(metadata=metadata or None, **fields)


def failure(body: dict[str, Any]) -> tuple[str, str | None, str | None]:
    return body["status"], body["err_category"], body["err_message"]


def test_102_and_124_happy_path_with_a_plain_http_workflow(fleet: V2FleetUnderTest) -> None:
    final = run(fleet)
    assert (final["status"], final["err_message"], final["err_category"]) == ("success", None, None)
    sample = final["sample"]
    assert (sample["reward"], sample["remove_sample"], sample["label"]) == (1.0, False, "42")
    assert sample["messages"][0] == {"role": "user", "content": "What is 6 * 7?"}
    assert sample["messages"][1]["role"] == "assistant"
    assert sample["messages"][1]["tool_calls"][0]["function"]["name"] == "multiply"
    # 124: the scripted workflow calls the TrainGate with plain, non-streaming JSON.
    (call,) = fleet.trainer.calls("chat", final["rollout_id"])
    assert "stream" not in call["body"]


def test_each_rollout_gets_its_artifacts_directory_on_the_worker(
    fleet: V2FleetUnderTest, artifact_root: Path
) -> None:
    """S§2.14: the worker running a rollout makes ``<root>/<rollout_id>/artifacts/`` (the
    session's root here: the fleet's processes inherit it from the test session)."""
    final = run(fleet)
    assert final["status"] == "success"
    assert (artifact_root / final["rollout_id"] / "artifacts").is_dir()


def test_103_grade_false_skips_the_grader(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, grade=False)
    assert final["status"] == "success"
    assert final["sample"]["reward"] is None
    assert "seen_label" not in final["sample"]["extra_fields"]


def test_104_nothing_to_grade_against_is_a_failure(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, label=None)  # and no metadata
    assert final["status"] == "failure"
    assert final["err_category"] == "validation_error"  # [decision] the reference says nothing
    assert "neither a label nor metadata" in final["err_message"]
    assert final["sample"]["reward"] is None


def test_105_metadata_without_label_is_graded(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, label=None, metadata={"row": 7})
    assert final["status"] == "success"
    assert final["sample"]["extra_fields"]["seen_label"] is None
    assert final["sample"]["extra_fields"]["seen_metadata"] == {"row": 7}


def test_106_a_crashing_workflow_is_agent_error(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, script=[{"raise": ["RuntimeError", "agent exploded"]}])
    assert failure(final) == ("failure", "agent_error", "agent exploded")
    assert final["sample"] is None


def test_107_value_error_is_validation_error(fleet: V2FleetUnderTest) -> None:
    assert failure(run(fleet, script=[{"raise": ["ValueError", "bad row"]}])) == (
        "failure",
        "validation_error",
        "bad row",
    )


def test_108_a_failing_grader_keeps_the_sample_without_reward(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, grader=[{"raise": ["ValueError", "bad grade"]}])
    assert failure(final) == ("failure", "validation_error", "bad grade")
    assert final["sample"]["reward"] is None
    assert final["sample"]["messages"]


def test_109_a_grader_that_sets_no_reward(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, grader=[])
    assert failure(final) == ("failure", "validation_error", "Sample has no reward after grading")


def test_110_a_removed_sample_carries_no_reward(fleet: V2FleetUnderTest) -> None:
    for steps in ([{"reward": 1.0}, {"remove": True}], [{"remove": True}]):
        final = run(fleet, grader=steps)
        assert final["status"] == "success"
        assert final["sample"]["remove_sample"] is True
        assert final["sample"]["reward"] is None


def test_111_a_nan_reward_is_refused(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, grader=[{"reward": "nan"}])
    assert final["status"] == "failure"
    assert final["err_category"] == "validation_error"


def test_112_the_agent_deadline_and_the_freed_slot(narrow: V2FleetUnderTest) -> None:
    final = run(narrow, script=[{"sleep": 2}], agent_timeout_sec=0.2)
    assert final["status"] == "failure"
    assert final["err_category"] == "timeout"
    assert "workflow exceeded its 0.2s deadline" in final["err_message"]
    assert run(narrow)["status"] == "success"  # the only slot was released


def test_113_the_grader_deadline(fleet: V2FleetUnderTest) -> None:
    final = run(fleet, grader=[{"sleep": 2}, {"reward": 1.0}], grader_timeout_sec=0.2)
    assert final["status"] == "failure"
    assert final["err_category"] == "timeout"
    assert "grader exceeded its 0.2s deadline" in final["err_message"]


def test_114_time_in_the_queue_counts_against_the_agent_deadline(narrow: V2FleetUnderTest) -> None:
    busy = narrow.admitted(metadata={"script": [{"sleep": 1.0}]})
    narrow.wait_status(busy[0], {"running"})
    final = run(narrow, script=[], agent_timeout_sec=0.5)
    assert final["status"] == "failure"
    assert final["err_category"] == "timeout"
    assert "spent queued" in final["err_message"]
    narrow.result(*busy)


def test_115_the_workflow_sees_no_label_and_the_grader_does(fleet: V2FleetUnderTest) -> None:
    prompt = [
        {"role": "system", "content": "be exact"},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    final = fleet.run(initial_messages=prompt, metadata={"script": [{"echo": True}], "row": 3})
    seen = json.loads(final["sample"]["messages"][-1]["content"])
    assert seen["prompt"] == prompt
    assert seen["metadata"] == {"script": [{"echo": True}], "row": 3}
    assert seen["has_label"] is False
    assert final["sample"]["extra_fields"]["seen_label"] == "42"
    assert final["sample"]["extra_fields"]["seen_metadata"]["row"] == 3


def test_116_unencodable_telemetry_is_dropped_and_the_reward_survives(
    fleet: V2FleetUnderTest,
) -> None:
    final = run(fleet, grader=[{"poison": True}, {"reward": 1.0}])
    assert final["status"] == "success"
    assert final["sample"]["reward"] == 1.0
    assert final["sample"]["metrics"] == {"fine": 1.5}
    assert "object" not in final["sample"]["extra_fields"]


def test_117_return_values(fleet: V2FleetUnderTest) -> None:
    listed = run(fleet, script=[{"echo": True}], grade=False)
    assert listed["status"] == "success"
    assert len(listed["sample"]["messages"]) == 2  # the returned list is the sample

    sourced = run(fleet, script=[{"register": "main"}, {"return": "int"}], grade=False)
    assert sourced["status"] == "success"  # [decision] an odd return falls back to the source
    assert sourced["sample"]["messages"] == [{"role": "assistant", "content": "from main"}]

    orphan = run(fleet, script=[{"return": "int"}])
    assert orphan["status"] == "failure"
    assert orphan["err_category"] == "validation_error"
    assert "got int" in orphan["err_message"]


def test_seed_multi_sample_rollouts_keep_every_sample(fleet: V2FleetUnderTest) -> None:
    script = [{"register": "alice"}, {"register": "bob"}, {"return": "none"}]
    final = run(fleet, script=script, grader=[{"reward_each": 0.5}])
    assert final["status"] == "success"
    assert final["sample"]["reward"] == 0.5
    samples = final["sample"]["extra_fields"]["osmosis_samples"]
    assert set(samples) == {"alice", "bob"}
    assert samples["bob"]["messages"] == [{"role": "assistant", "content": "from bob"}]
    assert samples["bob"]["reward"] == 0.5

    unrewarded = run(fleet, script=script, grader=[{"reward": 1.0}])  # only the first
    assert unrewarded["err_message"] == "Sample has no reward after grading"


def test_118_each_rollout_gets_a_fresh_workflow_and_config(fleet: V2FleetUnderTest) -> None:
    for _ in range(3):
        final = run(fleet, script=[{"echo": True}], grade=False)
        seen = json.loads(final["sample"]["messages"][-1]["content"])
        assert (seen["instance_runs"], seen["config_visits"]) == (1, 1)
