"""Helpers for executing the tool calls an LLM returns (SDK.md §1.9)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rollout_sdk.core.exceptions import ToolArgumentError

ToolCall = Mapping[str, Any]
ToolMessage = dict[str, Any]


def create_tool_result(tool_call_id: str, content: Any) -> ToolMessage:
    """A ``tool`` message answering ``tool_call_id``; ``content`` passes through unchanged."""
    return {"role": "tool", "content": content, "tool_call_id": tool_call_id}


def create_tool_error_result(tool_call_id: str, error_message: str) -> ToolMessage:
    return create_tool_result(tool_call_id, f"Error: {error_message}")


def serialize_tool_result(value: Any) -> str:
    """Render a tool's return value as message content (bools as JSON, numbers via ``str``)."""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return value
    return json.dumps(value)


def parse_tool_arguments(arguments: Any) -> dict[str, Any]:
    """Decode a tool call's ``arguments`` (a JSON object string, or already a dict)."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        raise ToolArgumentError(f"Expected str or dict arguments, got {type(arguments).__name__}")
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(f"Invalid JSON arguments: {exc}") from exc
    if not isinstance(decoded, dict):
        raise ToolArgumentError(f"Expected dict from JSON, got {type(decoded).__name__}")
    return decoded


def get_tool_call_info(tool_call: ToolCall) -> tuple[str, str, dict[str, Any]]:
    """``(id, name, arguments)`` of an OpenAI tool call; a bad call raises ``ToolArgumentError``
    carrying ``tool_call_id``/``tool_name`` so the caller can answer it with an error result."""
    tool_call_id = tool_call.get("id", "unknown")
    function = tool_call.get("function", {})
    name = function.get("name", "")
    try:
        arguments = parse_tool_arguments(function.get("arguments", {}))
    except ToolArgumentError as exc:
        raise ToolArgumentError(str(exc), tool_call_id=tool_call_id, tool_name=name) from exc
    return tool_call_id, name, arguments


async def execute_tool_calls(
    tool_calls: list[ToolCall] | None,
    executor: Callable[[ToolCall], Awaitable[ToolMessage]],
) -> list[ToolMessage]:
    """Run ``executor`` on every call concurrently; results come back in input order."""
    if not tool_calls:
        return []
    return list(await asyncio.gather(*(executor(call) for call in tool_calls)))


__all__ = [
    "create_tool_error_result",
    "create_tool_result",
    "execute_tool_calls",
    "get_tool_call_info",
    "parse_tool_arguments",
    "serialize_tool_result",
]
