"""Small helpers over OpenAI chat messages (``osmosis_ai.rollout.utils``).

They are total functions, as upstream's are: a message without the field asked for (or with
a value of the wrong type) gives the neutral answer — ``""`` for content, ``"unknown"`` for
the role, ``[]`` for tool calls — never ``None`` or an exception.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

UNKNOWN_ROLE = "unknown"


def normalize_stop(stop: Any) -> list[str] | None:
    """``"x"`` → ``["x"]``; a list → each element ``str()``-ed; anything else → ``None``."""
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [str(item) for item in stop]
    return None


def parse_tool_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The message's tool calls; ``[]`` when missing, ``null`` or not a list."""
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def get_message_content(message: Mapping[str, Any]) -> str:
    """The message's text content; ``""`` when missing or not a string (e.g. content parts)."""
    content = message.get("content")
    return content if isinstance(content, str) else ""


def get_message_role(message: Mapping[str, Any]) -> str:
    """The message's role; ``"unknown"`` when missing or not a string."""
    role = message.get("role")
    return role if isinstance(role, str) else UNKNOWN_ROLE


def is_assistant_message(message: Mapping[str, Any]) -> bool:
    return get_message_role(message) == "assistant"


def is_tool_message(message: Mapping[str, Any]) -> bool:
    return get_message_role(message) == "tool"


def is_user_message(message: Mapping[str, Any]) -> bool:
    return get_message_role(message) == "user"


def count_messages_by_role(messages: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """``{role: count}``, in order of first appearance; role-less messages count as unknown."""
    return dict(Counter(get_message_role(message) for message in messages))


def ensure_bearer_token(value: str | None, *, label: str) -> str | None:
    """A key sent as ``Authorization: Bearer <key>`` must fit in a header: visible ASCII, no
    spaces or control characters (else every request with it would fail to be built)."""
    if value is not None and not all("!" <= c <= "~" for c in value):
        raise ValueError(
            f"{label} must be visible ASCII without spaces or control characters "
            "(it is sent as an HTTP Bearer token)"
        )
    return value


__all__ = [
    "count_messages_by_role",
    "ensure_bearer_token",
    "get_message_content",
    "get_message_role",
    "is_assistant_message",
    "is_tool_message",
    "is_user_message",
    "normalize_stop",
    "parse_tool_calls",
]
