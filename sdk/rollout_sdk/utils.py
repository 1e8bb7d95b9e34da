"""Small helpers over OpenAI chat messages (``osmosis_ai.rollout.utils``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any


def normalize_stop(stop: Any) -> list[str] | None:
    """``"x"`` → ``["x"]``; a list → each element ``str()``-ed; anything else → ``None``."""
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [str(item) for item in stop]
    return None


def parse_tool_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The message's tool calls, ``[]`` when it has none (also when the key is ``null``)."""
    return list(message.get("tool_calls") or [])


def get_message_content(message: Mapping[str, Any]) -> Any:
    return message.get("content")


def get_message_role(message: Mapping[str, Any]) -> str | None:
    role = message.get("role")
    return role if isinstance(role, str) else None


def is_assistant_message(message: Mapping[str, Any]) -> bool:
    return get_message_role(message) == "assistant"


def is_tool_message(message: Mapping[str, Any]) -> bool:
    return get_message_role(message) == "tool"


def is_user_message(message: Mapping[str, Any]) -> bool:
    return get_message_role(message) == "user"


def count_messages_by_role(messages: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return dict(Counter(get_message_role(m) or "unknown" for m in messages))


__all__ = [
    "count_messages_by_role",
    "get_message_content",
    "get_message_role",
    "is_assistant_message",
    "is_tool_message",
    "is_user_message",
    "normalize_stop",
    "parse_tool_calls",
]
