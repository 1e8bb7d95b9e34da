"""CONFORMANCE §E — the completion callback (P§1.6-1.7): body shapes, metrics, retries."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import FleetUnderTest, script

METRIC_KEYS = {
    "total_latency_ms",
    "llm_latency_ms",
    "tool_latency_ms",
    "num_llm_calls",
    "num_tool_calls",
    "prompt_tokens",
    "response_tokens",
    "max_context_tokens",
}


def admit(fleet: FleetUnderTest, *steps: dict[str, Any], **fields: Any) -> str:
    body = fleet.body(metadata=script(*steps), **fields)
    assert fleet.init(body).status_code == 202
    rollout_id: str = body["rollout_id"]
    return rollout_id


def delivered(fleet: FleetUnderTest, rollout_id: str) -> dict[str, Any]:
    deliveries = fleet.wait_delivered([rollout_id])[rollout_id]
    assert len(deliveries) == 1
    return deliveries[0]


def test_36_exactly_one_callback_per_rollout(fleet: FleetUnderTest) -> None:
    ids = [admit(fleet, {"chat": {}}, {"complete": {}}) for _ in range(10)]
    for rollout_id in ids:
        fleet.wait_status(rollout_id, {"success"})
    deliveries = fleet.trainer.deliveries()
    assert [len(deliveries[i]) for i in ids] == [1] * 10
    assert [len(fleet.trainer.calls("completed", i)) for i in ids] == [1] * 10


def test_37_completed_body(fleet: FleetUnderTest) -> None:
    rollout_id = admit(fleet, {"chat": {}}, {"complete": {"finish_reason": "stop", "reward": 1.0}})
    body = delivered(fleet, rollout_id)
    assert body["status"] == "COMPLETED"
    assert body["finish_reason"] == "stop"
    assert body["reward"] == 1.0
    assert body["extra_fields"] == {}
    assert "error_message" not in body
    assert body["metrics"].keys() == METRIC_KEYS
    (chat,) = fleet.trainer.calls("chat", rollout_id)
    reply = chat["body"]["messages"] + [{"role": "assistant", "content": "OK."}]
    assert body["final_messages"] == reply


def test_38_no_reward_means_no_reward_key(fleet: FleetUnderTest) -> None:
    body = delivered(fleet, admit(fleet, {"complete": {"reward": None}}))
    assert body["status"] == "COMPLETED"
    assert "reward" not in body


def test_39_run_raising_reports_error_with_its_message(fleet: FleetUnderTest) -> None:
    body = delivered(fleet, admit(fleet, {"chat": {}}, {"raise": "boom"}))
    assert body["status"] == "ERROR"
    assert body["final_messages"] == []
    assert body["finish_reason"] == "error"
    assert body["error_message"] == "boom"
    assert body["metrics"]["num_llm_calls"] == 1


def test_40_ctx_error_keeps_the_given_messages(fleet: FleetUnderTest) -> None:
    rollout_id = admit(fleet, {"chat": {}}, {"error": "bad"})
    body = delivered(fleet, rollout_id)
    assert body["status"] == "ERROR"
    assert body["finish_reason"] == "error"
    assert body["error_message"] == "bad"
    assert [m["role"] for m in body["final_messages"]] == ["user", "assistant"]


def test_41_metrics_count_calls_tokens_and_tool_latency(fleet: FleetUnderTest) -> None:
    rollout_id = admit(
        fleet,
        {"chat": {}},
        {"record_tool_call": 12.5},
        {"chat": {}},
        {"record_tool_call": 7.5},
        {"record_tool_call": 0},
        {"complete": {}},
    )
    metrics = delivered(fleet, rollout_id)["metrics"]
    chats = fleet.trainer.calls("chat", rollout_id)
    # The mock's usage: prompt = 10 per message sent, completion = len("OK.").
    assert metrics["num_llm_calls"] == 2
    assert metrics["prompt_tokens"] == sum(10 * len(c["body"]["messages"]) for c in chats)
    assert metrics["response_tokens"] == 2 * len("OK.")
    assert metrics["num_tool_calls"] == 3
    assert metrics["tool_latency_ms"] == pytest.approx(20.0)
    assert metrics["max_context_tokens"] == 0
    assert metrics["total_latency_ms"] >= metrics["llm_latency_ms"] > 0


def _completed_statuses(fleet: FleetUnderTest, rollout_id: str) -> list[int]:
    return [call["status"] for call in fleet.trainer.calls("completed", rollout_id)]


def _with_callback_faults(fleet: FleetUnderTest, *faults: dict[str, Any]) -> str:
    body = fleet.body(metadata=script({"complete": {}}))
    rid = body["rollout_id"]
    fleet.trainer.add_faults(*({"target": "completed", "rollout_id": rid, **f} for f in faults))
    assert fleet.init(body).status_code == 202
    return rid


def test_42_callback_503_twice_then_200_is_delivered_on_the_third_attempt(
    fleet: FleetUnderTest,
) -> None:
    rollout_id = _with_callback_faults(fleet, {"status": 503, "times": 2})
    record = fleet.wait_status(rollout_id, {"success", "failure"})
    assert _completed_statuses(fleet, rollout_id) == [503, 503, 200]
    # The two 503'd attempts were sent whole: the trainer may have taken them before failing.
    assert record["delivery"] == (
        "delivered on attempt 3; the trainer may have received the 2 before"
    )


def test_42_callback_always_503_stops_after_three_attempts_with_a_clear_state(
    fleet: FleetUnderTest,
) -> None:
    rollout_id = _with_callback_faults(fleet, {"status": 503, "times": None})
    record = fleet.wait_status(rollout_id, {"success", "failure"})
    assert _completed_statuses(fleet, rollout_id) == [503, 503, 503]
    assert record["delivery"].startswith("failed: ")
    assert "503" in record["delivery"]


def test_43_callback_400_is_not_retried(fleet: FleetUnderTest) -> None:
    rollout_id = _with_callback_faults(fleet, {"status": 400, "times": None})
    record = fleet.wait_status(rollout_id, {"success", "failure"})
    assert _completed_statuses(fleet, rollout_id) == [400]
    assert record["delivery"].startswith("failed: ")


def test_44_callback_204_counts_as_delivered(fleet: FleetUnderTest) -> None:
    rollout_id = _with_callback_faults(fleet, {"status": 204, "times": None})
    record = fleet.wait_status(rollout_id, {"success", "failure"})
    assert _completed_statuses(fleet, rollout_id) == [204]
    assert record["delivery"] == "delivered"
