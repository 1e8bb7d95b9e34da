"""CONFORMANCE §G item 62: the mock TrainGate's reference behaviour (S§1.14), plus the
calculator responder and the fault API the fleet tests rely on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rollout_sdk.testing import (
    RolloutCompletionTracker,
    create_mock_trainer_app,
    fake_prompt_token_ids,
    fake_token_ids,
)

Serve = Callable[[Any], str]  # the `serve` fixture: ASGI app -> base URL


def chat(url: str, messages: list[dict[str, Any]], rollout_id: str = "r1") -> dict[str, Any]:
    response = httpx.post(
        f"{url}/v1/chat/completions", json={"rollout_id": rollout_id, "messages": messages}
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def reference_mock(serve: Serve) -> str:
    return serve(create_mock_trainer_app())


def test_62_calculation_words_get_an_add_tool_call(reference_mock: str) -> None:
    body = chat(reference_mock, [{"role": "user", "content": "Please CALCULATE this"}])
    message = body["choices"][0]["message"]
    assert message["content"] == "I'll help you with that calculation."
    assert message["tool_calls"] == [
        {
            "id": "call_mock_add",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 5, "b": 3}'},
        }
    ]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["id"] == "r1"


def test_62_after_a_tool_message_and_otherwise(reference_mock: str) -> None:
    after_tool = chat(reference_mock, [{"role": "tool", "content": "8", "tool_call_id": "c"}])
    assert after_tool["choices"][0]["message"]["content"] == "The calculation is complete."
    plain = chat(reference_mock, [{"role": "user", "content": "hello"}])
    assert plain["choices"][0]["message"]["content"] == "OK."
    assert plain["token_ids"] == fake_token_ids("OK.") == [0, 1, 2]
    assert len(plain["logprobs"]) == 3
    assert plain["prompt_token_ids"] == fake_prompt_token_ids([{}]) == list(range(10))
    assert plain["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    empty = chat(reference_mock, [])
    assert empty["choices"][0]["message"]["content"] == "OK."


def test_tool_call_generator_overrides_the_keyword_rule(serve: Serve) -> None:
    calls = [{"id": "g", "type": "function", "function": {"name": "x", "arguments": "{}"}}]
    url = serve(create_mock_trainer_app(tool_call_generator=lambda last: calls))
    assert (
        chat(url, [{"role": "user", "content": "hi"}])["choices"][0]["message"]["tool_calls"]
        == calls
    )


def test_completed_is_stored_tracked_and_readable(serve: Serve) -> None:
    tracker = RolloutCompletionTracker()
    url = serve(create_mock_trainer_app(tracker))
    payload = {"rollout_id": "r7", "status": "COMPLETED", "final_messages": [], "reward": None}
    assert httpx.post(f"{url}/v1/rollout/completed", json=payload).json() == {"status": "ok"}
    assert tracker.wait(1)
    assert tracker.responses == [
        {"rollout_id": "r7", "status": "COMPLETED", "final_messages": [], "extra_fields": {}}
    ]
    assert httpx.get(f"{url}/v1/rollout/completed/r7").json()["status"] == "COMPLETED"
    assert httpx.get(f"{url}/v1/rollout/completed/nope").json() == {}
    assert httpx.get(f"{url}/health").json() == {"status": "healthy", "service": "mock-trainer"}


def test_the_completed_feed_pages_from_a_cursor_even_without_recorded_calls(
    serve: Serve,
) -> None:
    url = serve(create_mock_trainer_app(record_calls=False))
    for rollout_id in ("a", "b"):
        payload = {"rollout_id": rollout_id, "status": "COMPLETED", "final_messages": []}
        httpx.post(f"{url}/v1/rollout/completed", json=payload).raise_for_status()
    feed = httpx.get(f"{url}/mock/completed").json()
    assert [rollout_id for rollout_id, _ in feed["completed"]] == ["a", "b"]
    assert feed["next"] == 2
    assert httpx.get(f"{url}/mock/completed", params={"since": 1}).json()["completed"][0][0] == "b"
    assert httpx.get(f"{url}/mock/completed", params={"since": 2}).json()["completed"] == []
    assert httpx.get(f"{url}/mock/calls").json() == []


def test_faults_are_consumed_in_order_and_scoped_by_rollout(serve: Serve) -> None:
    url = serve(create_mock_trainer_app())
    faults = [
        {"target": "chat", "status": 503, "times": 2, "rollout_id": "a"},
        {"target": "chat", "omit": ["usage"], "rollout_id": "b"},
    ]
    httpx.post(f"{url}/mock/faults", json=faults).raise_for_status()
    post = lambda rid: httpx.post(  # noqa: E731
        f"{url}/v1/chat/completions", json={"rollout_id": rid, "messages": []}
    )
    assert [post("a").status_code for _ in range(3)] == [503, 503, 200]
    assert "usage" not in post("b").json()
    assert "usage" in post("b").json()
    calls = httpx.get(f"{url}/mock/calls", params={"rollout_id": "a"}).json()
    assert [c["status"] for c in calls] == [503, 503, 200]


def test_calculator_responder_solves_with_tools(mock_trainer: tuple[str, Any]) -> None:
    url, _ = mock_trainer
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is (15 + 5) * 3?"}]
    first = chat(url, messages)["choices"][0]["message"]
    assert first["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 15, "b": 5}'}
    messages += [first, {"role": "tool", "content": "20", "tool_call_id": "call_0"}]
    second = chat(url, messages)["choices"][0]["message"]
    assert second["tool_calls"][0]["function"] == {
        "name": "multiply",
        "arguments": '{"a": 20, "b": 3}',
    }
    messages += [second, {"role": "tool", "content": "60", "tool_call_id": "call_1"}]
    assert chat(url, messages)["choices"][0]["message"]["content"] == "#### 60"
