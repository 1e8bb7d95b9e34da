"""How the mock TrainGate decides the next assistant turn.

A responder maps the conversation so far to an :class:`AssistantTurn`; the mock's HTTP layer
renders that turn as a v1 completion (and, later, as OpenAI JSON or SSE chunks), so the
scripting is written once for every wire shape.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = Mapping[str, Any]
ToolCallGenerator = Callable[[Message], list[dict[str, Any]] | None]


@dataclass(frozen=True)
class AssistantTurn:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


Responder = Callable[[Sequence[Message]], AssistantTurn]


def text_of(content: Any) -> str:
    """A message's text, whether ``content`` is a string or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def tool_call(call_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(dict(arguments))},
    }


# --- the reference mock's behaviour (SDK.md §1.14) --------------------------------------

CALCULATION_KEYWORDS = ("calculate", "add", "sum", "plus", "subtract", "multiply", "divide")


def _keyword_tool_calls(last: Message) -> list[dict[str, Any]]:
    content = last.get("content")
    asks_to_calculate = isinstance(content, str) and any(
        keyword in content.lower() for keyword in CALCULATION_KEYWORDS
    )
    if last.get("role") == "user" and asks_to_calculate:
        return [tool_call("call_mock_add", "add", {"a": 5, "b": 3})]
    return []


def keyword_responder(tool_call_generator: ToolCallGenerator | None = None) -> Responder:
    """Tool call ``add(5, 3)`` for calculation words; canned text otherwise."""

    def respond(messages: Sequence[Message]) -> AssistantTurn:
        last: Message = messages[-1] if messages else {"role": "user", "content": ""}
        if tool_call_generator is not None:
            calls = tool_call_generator(last) or []
        else:
            calls = _keyword_tool_calls(last)
        if calls:
            return AssistantTurn("I'll help you with that calculation.", calls)
        if last.get("role") == "tool":
            return AssistantTurn("The calculation is complete.")
        return AssistantTurn("OK.")

    return respond


# --- a calculator that solves arithmetic with add/multiply tool calls --------------------

_EXPRESSION = re.compile(r"[\d(][\d\s+\-*/().]*[\d)]")


@dataclass(frozen=True)
class _Operand:
    """A literal number, or the result of an earlier step."""

    literal: float | None = None
    step: int | None = None

    def value(self, results: list[float]) -> float:
        return self.literal if self.literal is not None else results[self.step or 0]


@dataclass(frozen=True)
class _Step:
    """One tool call: ``tool(a=left, b=right)``; subtraction and division map ``b``."""

    tool: str
    left: _Operand
    right: _Operand
    map_right: Callable[[float], float] = float

    def arguments(self, results: list[float]) -> dict[str, float | int]:
        return {
            "a": _plain(self.left.value(results)),
            "b": _plain(self.map_right(self.right.value(results))),
        }


# a - b == add(a, -b) and a / b == multiply(a, 1/b): the calculator only has add and multiply.
_OPERATORS: dict[type[ast.operator], tuple[str, Callable[[float], float]]] = {
    ast.Add: ("add", float),
    ast.Sub: ("add", operator.neg),
    ast.Mult: ("multiply", float),
    ast.Div: ("multiply", lambda b: 1 / b),
}


def _plan(expression: str) -> list[_Step] | None:
    """Post-order tool steps computing ``expression``; ``None`` if it is not arithmetic."""
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None
    steps: list[_Step] = []

    def visit(node: ast.AST) -> _Operand:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return _Operand(literal=float(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            operand = visit(node.operand)
            if operand.literal is None:
                raise ValueError("negated sub-expression")
            return _Operand(literal=-operand.literal)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = visit(node.left), visit(node.right)
            tool, map_right = _OPERATORS[type(node.op)]
            steps.append(_Step(tool, left, right, map_right))
            return _Operand(step=len(steps) - 1)
        raise ValueError(f"unsupported node {type(node).__name__}")

    try:
        visit(tree)
    except ValueError:
        return None
    return steps or None


def _plain(value: float) -> float | int:
    return int(value) if value.is_integer() else value


def _as_number(message: Message) -> float | None:
    try:
        return float(text_of(message.get("content")))
    except ValueError:
        return None


def calculator_responder(messages: Sequence[Message]) -> AssistantTurn:
    """Solve the user's arithmetic one tool call per turn, then answer ``#### <result>``."""
    question = next(
        (text_of(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    match = _EXPRESSION.search(question)
    plan = _plan(match.group(0)) if match else None
    if plan is None:
        return AssistantTurn("OK.")
    results = [
        number
        for m in messages
        if m.get("role") == "tool" and (number := _as_number(m)) is not None
    ]
    if len(results) >= len(plan):
        return AssistantTurn(f"#### {_plain(results[-1])}")
    step_index = len(results)
    call = tool_call(
        f"call_{step_index}", plan[step_index].tool, plan[step_index].arguments(results)
    )
    return AssistantTurn(None, [call], finish_reason="tool_calls")


RESPONDERS: dict[str, Callable[[], Responder]] = {
    "keyword": keyword_responder,
    "calculator": lambda: calculator_responder,
}

__all__ = [
    "RESPONDERS",
    "AssistantTurn",
    "Responder",
    "calculator_responder",
    "keyword_responder",
    "text_of",
    "tool_call",
]
