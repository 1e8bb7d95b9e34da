"""CONFORMANCE §D — the fleet's calls to ``{server_url}/v1/chat/completions`` (P§1.5), and
item 21 (the trainer key on both outbound calls). Faults are scoped to one rollout id."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from tests.harness import FleetUnderTest, script

BASE_KEYS = {"model", "messages", "rollout_id", "temperature", "top_p", "max_tokens", "logprobs"}


def run(fleet: FleetUnderTest, *steps: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """Admit one scripted rollout, wait for its callback, return the delivered body."""
    body = fleet.body(metadata=script(*steps), **fields)
    assert fleet.init(body).status_code == 202
    delivered = fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]
    assert len(delivered) == 1
    return delivered[0]


def chat_bodies(fleet: FleetUnderTest, rollout_id: str) -> list[dict[str, Any]]:
    return [call["body"] for call in fleet.trainer.calls("chat", rollout_id)]


def test_25_exact_keys_and_stripped_server_url(fleet: FleetUnderTest) -> None:
    done = run(
        fleet,
        {"chat": {"temperature": 0.5}},
        {"chat": {"stop": "END"}},
        {"complete": {}},
        server_url=fleet.trainer.url + "///",
    )
    assert done["status"] == "COMPLETED"  # a doubled slash would have missed the route
    first, second = chat_bodies(fleet, done["rollout_id"])
    assert first.keys() == BASE_KEYS
    assert second.keys() == BASE_KEYS | {"stop"}
    assert first["model"] == "default"
    assert first["rollout_id"] == done["rollout_id"]


def test_26_sampling_defaults(fleet: FleetUnderTest) -> None:
    done = run(fleet, {"chat": {}}, {"complete": {}})
    (sent,) = chat_bodies(fleet, done["rollout_id"])
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"], sent["logprobs"]) == (
        1.0,
        1.0,
        512,
        True,
    )


@pytest.mark.parametrize(
    ("stop", "expected"), [("END", ["END"]), (["a", 1], ["a", "1"]), (5, None)]
)
def test_27_stop_is_normalized(fleet: FleetUnderTest, stop: Any, expected: Any) -> None:
    done = run(fleet, {"chat": {"stop": stop}}, {"complete": {}})
    (sent,) = chat_bodies(fleet, done["rollout_id"])
    assert sent.get("stop") == expected
    assert ("stop" in sent) is (expected is not None)


def test_28_extra_kwargs_never_reach_the_wire(fleet: FleetUnderTest) -> None:
    extras = {"tools": [{"type": "function"}], "tool_choice": "auto", "seed": 1, "n": 2}
    done = run(fleet, {"chat": extras}, {"complete": {}})
    (sent,) = chat_bodies(fleet, done["rollout_id"])
    assert sent.keys() == BASE_KEYS


def test_29_each_call_carries_the_full_append_only_history(fleet: FleetUnderTest) -> None:
    done = run(fleet, {"chat": {}}, {"chat": {}}, {"chat": {}}, {"complete": {}})
    calls = chat_bodies(fleet, done["rollout_id"])
    assert len(calls) == 3
    for earlier, later in itertools.pairwise(calls):
        assert later["messages"][: len(earlier["messages"])] == earlier["messages"]
        assert len(later["messages"]) == len(earlier["messages"]) + 1


def test_30_agent_sees_the_message_verbatim_and_defaults_for_missing_fields(
    fleet: FleetUnderTest,
) -> None:
    body = fleet.body(
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        metadata=script({"inspect_chat": {}}, {"complete": {}}),
    )
    omit = ["finish_reason", "usage", "token_ids", "logprobs"]
    fleet.trainer.add_faults({"target": "chat", "omit": omit, "rollout_id": body["rollout_id"]})
    assert fleet.init(body).status_code == 202
    done = fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]][0]
    seen = json.loads(done["final_messages"][-1]["content"])
    call = seen["message"]["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert seen["tool_calls"] == seen["message"]["tool_calls"]
    assert seen["finish_reason"] == "stop"
    assert seen["usage"] == {}
    assert seen["token_ids"] == []
    assert seen["logprobs"] == []


def test_30_token_ids_and_logprobs_are_passed_through(fleet: FleetUnderTest) -> None:
    done = run(fleet, {"inspect_chat": {}}, {"complete": {}})
    seen = json.loads(done["final_messages"][-1]["content"])
    assert seen["token_ids"] == list(range(len("OK.")))
    assert seen["logprobs"] == [0.0, 0.0, 0.0]
    assert seen["usage"]["completion_tokens"] == 3


def _admit_with_chat_faults(fleet: FleetUnderTest, *faults: dict[str, Any]) -> dict[str, Any]:
    body = fleet.body(metadata=script({"chat": {}}, {"complete": {}}))
    fleet.trainer.add_faults(
        *({"target": "chat", "rollout_id": body["rollout_id"], **f} for f in faults)
    )
    assert fleet.init(body).status_code == 202
    delivered = fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]
    assert len(delivered) == 1
    return delivered[0]


def _statuses(fleet: FleetUnderTest, rollout_id: str) -> list[int]:
    return [call["status"] for call in fleet.trainer.calls("chat", rollout_id)]


def test_31_three_503s_then_success(fleet: FleetUnderTest) -> None:
    done = _admit_with_chat_faults(fleet, {"status": 503, "times": 3})
    assert done["status"] == "COMPLETED"
    assert _statuses(fleet, done["rollout_id"]) == [503, 503, 503, 200]


def test_32_and_35_persistent_500_is_retried_three_times_with_backoff(
    fleet: FleetUnderTest,
) -> None:
    done = _admit_with_chat_faults(fleet, {"status": 500, "times": None})
    assert done["status"] == "ERROR"
    assert done["error_message"]
    calls = fleet.trainer.calls("chat", done["rollout_id"])
    assert [c["status"] for c in calls] == [500, 500, 500, 500]
    # RETRY_BASE_DELAY=0.2 in the test fleet: gaps 0.2, 0.4, 0.8 s (±20 % / +0.5 s).
    gaps = [later["at"] - earlier["at"] for earlier, later in itertools.pairwise(calls)]
    for gap, expected in zip(gaps, [0.2, 0.4, 0.8], strict=True):
        assert expected * 0.8 <= gap <= expected + 0.5, gaps


@pytest.mark.parametrize("status", [400, 422])
def test_33_a_4xx_is_not_retried(fleet: FleetUnderTest, status: int) -> None:
    done = _admit_with_chat_faults(fleet, {"status": status, "times": None})
    assert done["status"] == "ERROR"
    assert str(status) in done["error_message"]
    assert _statuses(fleet, done["rollout_id"]) == [status]


def test_34_a_hang_past_the_client_timeout_is_retried_like_a_5xx(fleet: FleetUnderTest) -> None:
    # The test fleet's client timeout is 2 s; each attempt stalls 3 s.
    done = _admit_with_chat_faults(fleet, {"delay_s": 3, "status": 200, "times": None})
    assert done["status"] == "ERROR"
    assert "timed out" in done["error_message"]
    assert len(fleet.trainer.calls("chat", done["rollout_id"])) == 4


def test_21_trainer_key_goes_on_both_outbound_calls(fleet: FleetUnderTest) -> None:
    done = run(fleet, {"chat": {}}, {"complete": {}}, api_key="trainer-secret-abc")
    calls = fleet.trainer.calls(rollout_id=done["rollout_id"])
    assert {c["target"] for c in calls} == {"chat", "completed"}
    for call in calls:
        assert call["headers"]["authorization"] == "Bearer trainer-secret-abc"


def test_21_no_trainer_key_means_no_authorization_header(fleet: FleetUnderTest) -> None:
    done = run(fleet, {"chat": {}}, {"complete": {}})
    calls = fleet.trainer.calls(rollout_id=done["rollout_id"])
    assert len(calls) == 2
    assert all("authorization" not in call["headers"] for call in calls)
