"""What a chat answer's message may be: the OpenAI shape an agent expects, checked where the
answer enters (the v1 TrainGate client's parse; the integrations' OpenAI client, for whole
answers and for each streamed chunk).

A TrainGate is the trainer's, and its answers are untrusted bytes: a message whose ``role``
is not ``assistant`` or whose ``content`` is not text would otherwise pass as a success and
end up in the rollout's messages, the trajectory and the next prompt; one of thousands of
tool calls (a streamed tool call's ``index`` alike) would make the agent's framework run
them all. At most :data:`MAX_TOOL_CALLS` per answer. A mismatch fails the
call, naming the field (:class:`ChatAnswerInvalid`, a ``ValueError``: the rollout's category is
``validation_error``). Fields beyond these pass through untouched (servers add their own, such
as ``reasoning_content``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Tool calls one answer may hold: an agent's framework runs one task per call, so an answer
# of tens of thousands of small ones (well under any byte cap) stalls and balloons a worker.
MAX_TOOL_CALLS = 128


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Function(_Open):
    name: str
    arguments: str


class _ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: _Function


class AnswerMessage(_Open):
    """An answered message: the assistant's, its content text or none."""

    role: Literal["assistant"]
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = Field(None, max_length=MAX_TOOL_CALLS)


class _ChunkFunction(_Open):
    name: str | None = None
    arguments: str | None = None


class _ChunkToolCall(_Open):
    index: int = Field(ge=0, lt=MAX_TOOL_CALLS)
    id: str | None = None
    type: Literal["function"] | None = None
    function: _ChunkFunction | None = None


class AnswerDelta(_Open):
    """A streamed chunk's delta."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ChunkToolCall] | None = Field(None, max_length=MAX_TOOL_CALLS)


class ChatAnswerInvalid(ValueError):
    """A chat answer whose message is not the OpenAI shape (the SDK's own words: the field and
    what it must be, never its value)."""

    own_words = True


def _problem(exc: ValidationError, where: str = "") -> str:
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    loc = ".".join([where, *map(str, first["loc"])] if where else map(str, first["loc"]))
    return f"{loc}: {first['msg']}"


def message_problem(message: Any) -> str | None:
    """What is wrong with an answered ``message`` (``None``: nothing), as ``field: why``
    (the field within the message)."""
    try:
        AnswerMessage.model_validate(message)
    except ValidationError as exc:
        return _problem(exc)
    return None


_KEPT_OBJECTS = frozenset({"tool_calls", "function_call"})
_NUMBER = (int, float)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def kept_message(message: dict[str, Any]) -> dict[str, Any]:
    """An answered message as an agent keeps it: its fields of text and numbers, its tool
    calls; a field of a server's own holding a list or an object is dropped (the message is
    sent back in every later prompt, and such a field can hold megabytes of small objects)."""
    if all(_scalar(value) or name in _KEPT_OBJECTS for name, value in message.items()):
        return message
    return {
        name: value for name, value in message.items() if _scalar(value) or name in _KEPT_OBJECTS
    }


def kept_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Usage as counts: numbers, and objects of numbers one level down (``…_details``)."""
    kept: dict[str, Any] = {}
    for name, value in usage.items():
        if isinstance(value, _NUMBER) and not isinstance(value, bool):
            kept[name] = value
        elif isinstance(value, dict) and len(value) <= 32:
            inner = {k: v for k, v in value.items() if isinstance(v, _NUMBER)}
            if inner:
                kept[name] = inner
    return kept


def _choices(data: Any) -> list[tuple[int, Any]]:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return []
    return [(index, choice) for index, choice in enumerate(choices) if isinstance(choice, dict)]


def check_completion(data: Any) -> None:
    """Raise :class:`ChatAnswerInvalid` if a ``chat.completion`` body's messages are not the
    OpenAI shape (anything else about the body is its client's to judge)."""
    for index, choice in _choices(data):
        try:
            AnswerMessage.model_validate(choice.get("message"))
        except ValidationError as exc:
            raise ChatAnswerInvalid(
                "the TrainGate's chat answer is not an OpenAI chat completion: "
                + _problem(exc, f"choices.{index}.message")
            ) from None


def check_chunk(data: Any) -> None:
    """The same for one streamed ``chat.completion.chunk``'s deltas."""
    for index, choice in _choices(data):
        if "delta" not in choice:
            continue
        try:
            AnswerDelta.model_validate(choice["delta"])
        except ValidationError as exc:
            raise ChatAnswerInvalid(
                "the TrainGate's chat answer is not an OpenAI chat completion chunk: "
                + _problem(exc, f"choices.{index}.delta")
            ) from None


__all__ = [
    "MAX_TOOL_CALLS",
    "AnswerDelta",
    "AnswerMessage",
    "ChatAnswerInvalid",
    "check_chunk",
    "check_completion",
    "kept_message",
    "kept_usage",
    "message_problem",
]
