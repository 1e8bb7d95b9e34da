"""Registry (S§1.12), message utils, settings (S§1.11) and the httpx patch helper (S§1.14)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from rollout_sdk import (
    AgentLoopNotFoundError,
    AgentLoopRegistry,
    OsmosisLLMClient,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
    RolloutSettings,
    get_agent_loop,
    get_settings,
    list_agent_loops,
    register_agent_loop,
    reset_settings,
    unregister_agent_loop,
)
from rollout_sdk.testing import create_mock_trainer_app, patch_httpx_for_mock_trainer
from rollout_sdk.utils import (
    count_messages_by_role,
    get_message_content,
    get_message_role,
    is_assistant_message,
    is_tool_message,
    is_user_message,
    normalize_stop,
    parse_tool_calls,
)


class Named(RolloutAgentLoop):
    name = "named"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        return ctx.complete([])


def test_registry() -> None:
    registry = AgentLoopRegistry()
    registry.register(Named())
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Named())
    assert registry.list_names() == ["named"]
    assert registry.get("nope") is None
    assert registry.unregister("named")
    assert not registry.unregister("named")

    register_agent_loop(Named())
    try:
        assert get_agent_loop("named").name == "named"
        assert "named" in list_agent_loops()
        with pytest.raises(
            AgentLoopNotFoundError, match=r"Agent loop 'x' not found. Available: \["
        ):
            get_agent_loop("x")
    finally:
        unregister_agent_loop("named")


def test_message_utils() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "1", "tool_call_id": "c"},
        {"role": "assistant", "content": "a", "tool_calls": None},
    ]
    assert parse_tool_calls(messages[1]) == [call]
    assert parse_tool_calls(messages[3]) == []
    assert [get_message_role(m) for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert get_message_content(messages[0]) == "q"
    assert is_user_message(messages[0])
    assert is_tool_message(messages[2])
    assert is_assistant_message(messages[3])
    assert count_messages_by_role(messages) == {"user": 1, "assistant": 2, "tool": 1}
    assert normalize_stop("x") == ["x"]
    assert normalize_stop(["a", 1]) == ["a", "1"]
    assert normalize_stop(5) is None


def test_message_utils_are_total_functions() -> None:
    """Upstream's helpers never answer None or raise: missing or mistyped fields give "",
    "unknown" or []."""
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert get_message_content(parts) == ""
    assert get_message_content({"role": "assistant", "content": None}) == ""
    assert get_message_content({}) == ""
    assert get_message_role({"content": "x"}) == "unknown"
    assert get_message_role({"role": 3}) == "unknown"
    assert not is_user_message({})
    assert parse_tool_calls({"tool_calls": "call"}) == []  # not iterated into characters
    assert parse_tool_calls({"tool_calls": {"id": "c"}}) == []
    assert parse_tool_calls({}) == []
    assert count_messages_by_role([{"role": "user"}, {}, {"role": None}]) == {
        "user": 1,
        "unknown": 2,
    }


def test_settings_come_from_the_environment_and_are_range_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES", "7")
    monkeypatch.setenv("OSMOSIS_ROLLOUT_SERVER_RECORD_TTL_SECONDS", "120")
    monkeypatch.setenv("OSMOSIS_ROLLOUT_MAX_METADATA_SIZE_BYTES", "4096")
    reset_settings()
    settings = get_settings()
    assert settings.client.max_retries == 7
    assert settings.server.record_ttl_seconds == 120
    assert settings.max_metadata_size_bytes == 4096
    assert get_settings() is settings
    monkeypatch.setenv("OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES", "11")
    with pytest.raises(ValidationError, match="max_retries"):
        RolloutSettings()


@pytest.mark.anyio
async def test_patch_httpx_routes_trainer_calls_to_a_test_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_mock_trainer_app()
    with TestClient(app) as client:
        patch_httpx_for_mock_trainer(client, monkeypatch)
        async with OsmosisLLMClient("http://trainer.invalid", "r-1") as llm:
            reply = await llm.chat_completions([{"role": "user", "content": "add these"}])
            await llm.complete_rollout("COMPLETED", [reply.message])
        assert reply.has_tool_calls
        assert app.state.gate.deliveries["r-1"][0]["status"] == "COMPLETED"
        with pytest.raises(httpx.ConnectError):
            await httpx.AsyncClient().post("http://127.0.0.1:1/elsewhere")
