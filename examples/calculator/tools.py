"""The calculator's tools: their schemas (sent to the trainer) and their implementations."""

from __future__ import annotations

from typing import Any

from rollout_sdk.core.exceptions import ToolArgumentError
from rollout_sdk.tools import (
    create_tool_error_result,
    create_tool_result,
    get_tool_call_info,
    serialize_tool_result,
)


def _number(description: str) -> dict[str, str]:
    return {"type": "number", "description": description}


CALCULATOR_TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers (subtract by adding a negative number)",
            "parameters": {
                "type": "object",
                "properties": {"a": _number("first addend"), "b": _number("second addend")},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers (divide by multiplying by a reciprocal)",
            "parameters": {
                "type": "object",
                "properties": {"a": _number("first factor"), "b": _number("second factor")},
                "required": ["a", "b"],
            },
        },
    },
]

OPERATIONS = {
    "add": lambda a, b: a + b,
    "multiply": lambda a, b: round(a * b, 4),
}


async def execute_tool(tool_call: dict[str, Any]) -> dict[str, Any]:
    """Run one tool call; a bad call becomes an error message the model can read."""
    try:
        call_id, name, arguments = get_tool_call_info(tool_call)
    except ToolArgumentError as exc:
        return create_tool_error_result(exc.tool_call_id, str(exc))
    operation = OPERATIONS.get(name)
    if operation is None:
        return create_tool_error_result(call_id, f"Unknown tool: {name}")
    try:
        return create_tool_result(call_id, serialize_tool_result(operation(**arguments)))
    except (TypeError, ArithmeticError) as exc:
        return create_tool_error_result(call_id, str(exc))
