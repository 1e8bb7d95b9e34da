"""Live trajectory previews (upstream 0.3.6 on): with ``_OSMOSIS_ROLLOUT_PREVIEW_ROOT`` set,
the in-process server keeps ``<root>/<rollout_id>/preview.json`` current while the rollout
runs (its conversation so far, its status) and ends it with the final status; keys and
credentials never reach the file."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from v2_client import admit, final

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    SampleSource,
    create_rollout_server,
    get_rollout_context,
)
from rollout_sdk.trajectory.preview import (
    MAX_PREVIEW_MESSAGES,
    PREVIEW_INTERVAL_SEC,
    preview_document,
    preview_root,
)
from rollout_sdk.types import RolloutSample

Serve = Callable[[Any], str]
KEY = "sk-rollout-key-0123456789"


class Conversation(SampleSource):
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]

    async def get_sample(self, *args: Any) -> RolloutSample:
        return RolloutSample(messages=self.messages, trajectory_messages=self.messages)

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        recent = list(self.messages[-max_messages:])
        return RolloutSample(messages=recent, trajectory_messages=recent)


class Talk(AgentWorkflow):
    """Says one thing (quoting the key), waits past a preview interval, says another."""

    async def run(self, ctx: AgentWorkflowContext) -> None:
        rollout = get_rollout_context()
        assert rollout is not None
        if ctx.metadata.get("no_preview"):
            rollout.preview_enabled = False
        conversation = Conversation()
        rollout.set_sample_source(conversation)
        conversation.messages.append(
            {"role": "assistant", "content": f"calling with {KEY} and Authorization: Bearer abc"}
        )
        await asyncio.sleep(PREVIEW_INTERVAL_SEC + 1.5)
        conversation.messages.append({"role": "assistant", "content": "done"})


class Full(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)


def read_preview(path: Path, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists():
            document: dict[str, Any] = json.loads(path.read_bytes())
            if until(document):
                return document
        time.sleep(0.05)
    raise AssertionError(f"no such preview at {path}")


def server(serve: Serve) -> str:
    backend = LocalBackend(workflow=Talk, grader=Full)
    return serve(create_rollout_server(backend=backend, configure_logging=False))


def test_the_preview_follows_the_rollout_and_ends_with_its_status(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_PREVIEW_ROOT", str(tmp_path))
    url = server(serve)
    token = admit(url, "pv-1", llm_api_key=KEY)
    path = tmp_path / "pv-1" / "preview.json"

    live = read_preview(path, lambda doc: True)
    assert live["extra"]["osmosis"]["status"] == "running"
    assert live["extra"]["osmosis"]["preview"] is True
    assert live["extra"]["osmosis"]["rollout_id"] == "pv-1"
    assert live["extra"]["osmosis"]["preview_version"] == 1
    assert live["session_id"] == live["trajectory_id"] == "pv-1"
    assert [step["message"] for step in live["steps"]] == [
        "hi",
        "calling with [REDACTED] and Authorization: [REDACTED]",
    ]

    assert final(url, "pv-1", token)["status"] == "success"
    done = read_preview(path, lambda doc: doc["extra"]["osmosis"]["status"] == "success")
    assert [step["message"] for step in done["steps"]][-1] == "done"
    assert [step["step_id"] for step in done["steps"]] == [1, 2, 3]
    assert done["extra"]["osmosis"]["preview_version"] > 1
    assert done["extra"]["osmosis"]["truncated"] is False
    assert KEY not in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["preview.json"]  # no temporary left


def test_no_preview_without_the_root_or_when_the_workflow_opts_out(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_PREVIEW_ROOT", str(tmp_path))
    url = server(serve)
    assert (
        final(url, "pv-2", admit(url, "pv-2", llm_api_key=KEY, no_preview=True))["status"]
        == "success"
    )
    monkeypatch.delenv("_OSMOSIS_ROLLOUT_PREVIEW_ROOT")
    assert final(url, "pv-3", admit(url, "pv-3", llm_api_key=KEY))["status"] == "success"
    assert list(tmp_path.iterdir()) == []


def test_a_preview_keeps_the_newest_messages_within_its_limits() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for turn in range(150):
        messages.append(
            {
                "role": "assistant",
                "content": f"turn {turn}",
                "tool_calls": [
                    {
                        "id": f"c{turn}",
                        "type": "function",
                        "function": {"name": "login", "arguments": '{"password": "hunter2"}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": "x" * 20_000})
    sample = RolloutSample(messages=messages, trajectory_messages=messages)
    document = preview_document(sample, "pv-4", None)
    assert document is not None
    assert document["extra"]["osmosis"]["truncated"] is True
    steps = document["steps"]
    assert 0 < len(steps) <= MAX_PREVIEW_MESSAGES
    assert steps[-1]["message"] == "turn 149"  # the newest survive
    assert [step["step_id"] for step in steps] == list(range(1, len(steps) + 1))
    assert steps[-1]["tool_calls"][0]["arguments"] == {"password": "[REDACTED]"}
    observed = steps[-1]["observation"]["results"][0]["content"]
    assert observed.endswith(" [preview truncated]")
    assert len(observed) < 20_000
    assert len(json.dumps(document)) <= 900 * 1024


def test_the_root_must_be_an_absolute_directory_without_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_PREVIEW_ROOT", str(tmp_path / "real"))
    assert preview_root("r-1") == tmp_path / "real"
    assert preview_root("../r-1") is None  # not one path segment
    caplog.set_level(logging.WARNING)
    for bad in ("relative/previews", str(tmp_path / "link")):
        monkeypatch.setenv("_OSMOSIS_ROLLOUT_PREVIEW_ROOT", bad)
        assert preview_root("r-1") is None
    assert [r.getMessage() for r in caplog.records] == [
        "_OSMOSIS_ROLLOUT_PREVIEW_ROOT must be an absolute directory without symlinks; "
        "live previews are off"
    ] * 2


@pytest.mark.anyio
async def test_the_openai_agents_session_previews_its_newest_items() -> None:
    from rollout_sdk.integrations.agents.openai_agents import (
        OsmosisMemorySession,
        SessionSampleSource,
    )

    session = OsmosisMemorySession("s-1")
    await session.add_items(
        [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2"},
        ]
    )
    preview = await SessionSampleSource(session).get_preview(2)
    assert preview is not None
    assert [m["content"] for m in preview.trajectory_messages or []] == ["q2", "a2"]
    assert preview.extra_fields == {"_preview_truncated": True, "_preview_turn": 2}
    document = preview_document(preview, "pv-5", None)
    assert document is not None
    assert [step["message"] for step in document["steps"]] == ["q2", "a2"]
    assert document["extra"]["osmosis"]["turn"] == 2


@pytest.mark.anyio
async def test_a_strands_agent_previews_its_newest_messages() -> None:
    from strands import Agent

    from rollout_sdk.integrations.agents.strands import StrandsAgentSampleSource

    history: list[Any] = [
        {"role": "user", "content": [{"text": "q1"}]},
        {"role": "assistant", "content": [{"text": "a1"}]},
        {"role": "user", "content": [{"text": "q2"}]},
    ]
    agent = Agent(messages=history, callback_handler=None)
    preview = await StrandsAgentSampleSource(agent).get_preview(2)
    assert preview is not None
    assert preview.extra_fields == {"_preview_truncated": True, "_preview_turn": 1}
    document = preview_document(preview, "pv-6", None)
    assert document is not None
    assert [step["message"] for step in document["steps"]] == ["a1", "q2"]
