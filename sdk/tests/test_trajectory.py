"""Trajectory archiving (upstream's ``osmosis_ai.rollout.trajectory``): a sample's chat
messages become an ATIF document saved beside the rollout's artifacts, by the in-process
server after every rollout."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowContext,
    LocalBackend,
    SampleSource,
    create_rollout_server,
    get_rollout_context,
)
from rollout_sdk.server import POLLING_LEASE_HEADER
from rollout_sdk.trajectory import (
    TrajectoryReport,
    convert_sample_to_trajectory,
    report_from_response,
    save_trajectory,
)
from rollout_sdk.trajectory.atif import format_trajectory_json
from rollout_sdk.types import ExecutionResult, RolloutSample, RolloutStatus

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2}'}}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 0, "input_tokens": 99},
        "model": "m-1",
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "tool", "tool_call_id": "c9", "content": "stray"},
    {"role": "assistant", "content": "5"},
    {"role": "critic", "content": "fine", "reasoning_content": "hidden"},
]


def sample(**fields: Any) -> RolloutSample:
    return RolloutSample(messages=MESSAGES, label="5", reward=1.0, **fields)


def test_chat_messages_become_atif_steps() -> None:
    document = convert_sample_to_trajectory(
        sample(), rollout_id="r-1", request_metadata={"run": "a"}
    ).to_json_dict()
    assert document["schema_version"] == "ATIF-v1.7"
    assert (document["session_id"], document["agent"]["name"]) == ("r-1", "rollout-sdk")
    steps = document["steps"]
    assert [(s["step_id"], s["source"]) for s in steps] == [
        (1, "system"),
        (2, "user"),
        (3, "agent"),
        (4, "agent"),
        (5, "user"),
    ]
    assert steps[1]["message"] == "2+3?"
    call = steps[2]
    assert call["tool_calls"] == [
        {"tool_call_id": "c1", "function_name": "add", "arguments": {"a": 2}}
    ]
    # A genuine 0 is not replaced by the Responses API's name for the field.
    assert call["metrics"] == {"prompt_tokens": 10, "completion_tokens": 0}
    assert (call["model_name"], call["llm_call_count"]) == ("m-1", 1)
    assert call["observation"]["results"] == [
        {"source_call_id": "c1", "content": "5"},
        {"content": "stray", "extra": {"tool_call_id": "c9"}},
    ]
    # An unknown role is kept; agent-only fields move to extra so the document stays valid.
    assert steps[4]["extra"] == {"original_role": "critic", "reasoning_content": "hidden"}
    assert document["final_metrics"] == {"total_steps": 5}
    assert document["extra"] == {
        "osmosis": {
            "rollout_id": "r-1",
            "label": "5",
            "reward": 1.0,
            "request_metadata": {"run": "a"},
        }
    }


def test_a_report_fills_the_agent_steps_only_when_its_calls_match() -> None:
    report = TrajectoryReport.model_validate(
        {
            "model_name": "policy",
            "samples": {
                "any-key": {
                    "llm_call_metrics": [
                        {"prompt_token_ids": [1, 2, 3], "model_name": "policy-7"},
                        {"completion_tokens": 4},
                    ]
                }
            },
        }
    )
    [entry] = report.samples.values()
    document = convert_sample_to_trajectory(sample(), rollout_id="r", report=entry)
    first, second = (step for step in document.steps if step.source == "agent")
    assert first.metrics is not None
    assert first.metrics.prompt_token_ids == [1, 2, 3]
    assert first.metrics.prompt_tokens == 10  # the message's own count is kept
    assert first.model_name == "policy-7"
    assert second.metrics is not None
    assert second.metrics.completion_tokens == 4
    assert document.final_metrics is not None
    assert document.final_metrics.total_completion_tokens == 4

    short = entry.model_copy(update={"llm_call_metrics": entry.llm_call_metrics[:1]})
    kept = convert_sample_to_trajectory(sample(), rollout_id="r", report=short)
    assert kept.extra is not None
    assert kept.extra["osmosis"]["unmatched_llm_call_metrics"] == [
        {"prompt_token_ids": [1, 2, 3], "model_name": "policy-7"}
    ]


def test_number_lists_stay_on_one_line_and_strings_are_untouched() -> None:
    text = format_trajectory_json({"ids": [1, 2, 3], "note": "[1,\n2]", "empty": []})
    assert '"ids": [1, 2, 3]' in text
    assert json.loads(text) == {"ids": [1, 2, 3], "note": "[1,\n2]", "empty": []}


def test_report_from_response_is_best_effort() -> None:
    def response(body: Any) -> httpx.Response:
        return httpx.Response(200, json=body)

    parsed = report_from_response(response({"trajectory": {"model_name": "m", "samples": {}}}))
    assert parsed == TrajectoryReport(model_name="m")
    assert report_from_response(response({"ok": True})) is None
    assert report_from_response(response({"trajectory": {"samples": 3}})) is None
    assert report_from_response(httpx.Response(200, text="not json")) is None


@pytest.mark.anyio
async def test_save_writes_the_document_and_diagnostics(tmp_path: Path) -> None:
    result = ExecutionResult(
        status=RolloutStatus.SUCCESS, sample=sample(), extra_fields={"phase": "done"}
    )
    await save_trajectory(rollout_id="r-2", result=result, artifact_root=tmp_path)
    saved = json.loads((tmp_path / "r-2" / "trajectory.json").read_text())
    assert saved["trajectory_id"] == "r-2"
    assert json.loads((tmp_path / "r-2" / "diagnostics.json").read_text()) == {"phase": "done"}

    opted_out = ExecutionResult(
        status=RolloutStatus.SUCCESS, sample=sample(trajectory_messages=None)
    )
    await save_trajectory(rollout_id="r-3", result=opted_out, artifact_root=tmp_path)
    assert not (tmp_path / "r-3").exists()

    blocker = tmp_path / "file"
    blocker.write_text("")
    await save_trajectory(rollout_id="r-4", result=result, artifact_root=blocker)  # no raise


class Echoed(SampleSource):
    def __init__(self, prompt: list[dict[str, Any]]) -> None:
        self.messages = [*prompt, {"role": "assistant", "content": "echo"}]

    async def get_sample(self, *args: Any) -> RolloutSample:
        return RolloutSample(messages=self.messages, reward=0.5)


class Echo(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        get_rollout_context().set_sample_source(Echoed(ctx.prompt))


def test_the_in_process_server_archives_each_rollout(
    serve: Callable[[Any], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(tmp_path))
    url = serve(create_rollout_server(backend=LocalBackend(workflow=Echo), configure_logging=False))
    admitted = httpx.post(
        f"{url}/rollout",
        json={
            "rollout_id": "r-5",
            "initial_messages": [{"role": "user", "content": "hi"}],
            "chat_completions_url": "http://127.0.0.1:9/v1",
            "label": "L",
            "grade": False,
        },
    )
    assert admitted.status_code == 202
    token = admitted.json()["polling_lease_token"]
    deadline = time.monotonic() + 30
    while True:
        result = httpx.get(
            f"{url}/rollout/r-5/result", headers={POLLING_LEASE_HEADER: token}
        ).json()
        if result["status"] not in ("queued", "running", "grading"):
            break
        assert time.monotonic() < deadline
    assert result["status"] == "success", result
    assert "trajectory_messages" not in (result.get("sample") or {})
    document = json.loads((tmp_path / "r-5" / "trajectory.json").read_text())
    assert [step["message"] for step in document["steps"]] == ["hi", "echo"]
    assert document["extra"]["osmosis"]["label"] == "L"
