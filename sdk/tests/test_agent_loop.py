"""CONFORMANCE §G items 49, 56, 57: the agent-loop base class and RolloutContext (S§1.2-1.6)."""

from __future__ import annotations

import json
from abc import abstractmethod
from pathlib import Path
from typing import Any

import pytest

from rollout_sdk import (
    RolloutAgentLoop,
    RolloutContext,
    RolloutMetrics,
    RolloutRequest,
    RolloutResult,
)


class _FakeLLM:
    def __init__(self) -> None:
        self.metrics = RolloutMetrics(num_llm_calls=2, prompt_tokens=30, llm_latency_ms=5.0)

    async def chat_completions(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        raise AssertionError("not called")

    def get_metrics(self) -> RolloutMetrics:
        return self.metrics.model_copy()


def _request(rollout_id: str = "r-1") -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rollout_id, server_url="http://tg", messages=[], completion_params={}
    )


def test_49_a_concrete_loop_without_a_name_fails_at_class_creation() -> None:
    with pytest.raises(TypeError, match="name"):

        class Nameless(RolloutAgentLoop):
            def get_tools(self, request: RolloutRequest) -> list[Any]:
                return []

            async def run(self, ctx: RolloutContext) -> RolloutResult:
                return ctx.complete([])

    with pytest.raises(TypeError, match="name"):

        class EmptyName(RolloutAgentLoop):
            name = ""

            def get_tools(self, request: RolloutRequest) -> list[Any]:
                return []

            async def run(self, ctx: RolloutContext) -> RolloutResult:
                return ctx.complete([])


def test_49_an_abstract_loop_without_a_name_is_fine() -> None:
    class Base(RolloutAgentLoop):
        @abstractmethod
        def helper(self) -> None: ...

    class Concrete(Base):
        name = "concrete"

        def helper(self) -> None:
            return None

        def get_tools(self, request: RolloutRequest) -> list[Any]:
            return [request.rollout_id]

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete([])

    assert Concrete().get_default_tools() == ["discovery"]


def test_56_complete_and_error_results() -> None:
    ctx = RolloutContext(_request(), [], _FakeLLM())
    done = ctx.complete([{"role": "assistant", "content": "hi"}])
    assert (done.status, done.finish_reason, done.reward) == ("COMPLETED", "stop", None)
    assert done.metrics is not None
    assert done.metrics.num_llm_calls == 2
    failed = ctx.error("x")
    assert (failed.status, failed.final_messages, failed.finish_reason) == ("ERROR", [], "error")
    assert failed.error_message == "x"


def test_record_tool_call_adds_to_the_metrics() -> None:
    ctx = RolloutContext(_request(), [], _FakeLLM(), _start_time=0.0)
    ctx.record_tool_call(latency_ms=2.5)
    ctx.record_tool_call()
    metrics = ctx.complete([]).metrics
    assert metrics is not None
    assert (metrics.num_tool_calls, metrics.tool_latency_ms) == (2, 2.5)
    assert metrics.total_latency_ms == 0.0  # no start time known
    assert metrics.prompt_tokens == 30


def test_57_log_event_writes_one_json_line_per_event(tmp_path: Path) -> None:
    ctx = RolloutContext(_request("r-9"), [], _FakeLLM(), _debug_dir=str(tmp_path / "traces"))
    assert ctx.debug_enabled
    ctx.log_event("pre_llm", turn=0)
    ctx.log_event("llm_response", has_tools=True, obj=object())
    ctx.log_event("done")
    lines = (tmp_path / "traces" / "r-9.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["pre_llm", "llm_response", "done"]
    assert all(e["rollout_id"] == "r-9" for e in events)
    assert events[0]["turn"] == 0
    assert events[1]["has_tools"] is True
    assert events[1]["obj"].startswith("<object")  # non-JSON values are stringified


def test_57_log_event_without_a_debug_dir_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ctx = RolloutContext(_request(), [], _FakeLLM())
    assert not ctx.debug_enabled
    ctx.log_event("pre_llm", turn=0)
    assert list(tmp_path.iterdir()) == []


def test_log_event_keeps_a_hostile_rollout_id_inside_the_debug_dir(tmp_path: Path) -> None:
    ctx = RolloutContext(_request("../../escape"), [], _FakeLLM(), _debug_dir=str(tmp_path / "d"))
    ctx.log_event("x")
    written = list((tmp_path / "d").iterdir())
    assert len(written) == 1
    assert written[0].parent == tmp_path / "d"
