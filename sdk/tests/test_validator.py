"""CONFORMANCE §G items 58-59: validate_agent_loop (S§1.10)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_sdk import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from rollout_sdk.validator import AgentLoopValidationError, ValidationError, validate_agent_loop


def loop_with(tools: Any = (), *, raises: Exception | None = None, sync_run: bool = False) -> Any:
    class Loop(RolloutAgentLoop):
        name = "probe"

        def get_tools(self, request: RolloutRequest) -> Any:
            if raises is not None:
                raise raises
            return list(tools) if isinstance(tools, tuple) else tools

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete([])

    loop = Loop()
    if sync_run:
        loop.run = lambda ctx: None  # type: ignore[method-assign,assignment]
    return loop


def codes(errors: list[ValidationError]) -> list[str]:
    return [e.code for e in errors]


FUNCTION = {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}


def test_58_each_problem_has_its_code() -> None:
    assert codes(validate_agent_loop(loop_with(raises=RuntimeError("x"))).errors) == [
        "GET_TOOLS_EXCEPTION"
    ]
    assert codes(validate_agent_loop(loop_with(None)).errors) == ["GET_TOOLS_RETURNS_NONE"]
    assert codes(validate_agent_loop(loop_with("nope")).errors) == ["GET_TOOLS_INVALID_TYPE"]
    assert codes(validate_agent_loop(loop_with(sync_run=True)).errors) == ["RUN_NOT_ASYNC"]
    nameless = {"type": "function", "function": {"description": "d"}}
    assert codes(validate_agent_loop(loop_with((nameless,))).errors) == ["MISSING_FUNCTION_NAME"]


@pytest.mark.parametrize(
    ("tool", "code"),
    [
        (42, "INVALID_TOOL_TYPE"),
        ({"function": FUNCTION}, "MISSING_TOOL_TYPE"),
        ({"type": "function"}, "MISSING_FUNCTION"),
        ({"type": "function", "function": "f"}, "INVALID_FUNCTION_TYPE"),
        ({"type": "function", "function": {**FUNCTION, "name": ""}}, "INVALID_FUNCTION_NAME"),
        (
            {"type": "function", "function": {**FUNCTION, "parameters": 3}},
            "INVALID_PARAMETERS_TYPE",
        ),
    ],
)
def test_58_tool_shape_errors(tool: Any, code: str) -> None:
    assert code in codes(validate_agent_loop(loop_with((tool,))).errors)


def test_58_a_missing_description_is_only_a_warning() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    result = validate_agent_loop(loop_with((tool,)))
    assert result.valid
    assert codes(result.warnings) == ["MISSING_FUNCTION_DESCRIPTION"]
    assert result.tool_count == 1
    assert result.agent_name == "probe"


def test_58_unknown_type_and_non_object_parameters_are_warnings() -> None:
    tool = {"type": "retrieval", "function": {**FUNCTION, "parameters": {"type": "array"}}}
    result = validate_agent_loop(loop_with((tool,)))
    assert codes(result.warnings) == ["UNKNOWN_TOOL_TYPE", "PARAMETERS_TYPE_NOT_OBJECT"]


def test_59_raise_if_invalid_and_error_rendering() -> None:
    result = validate_agent_loop(loop_with(None))
    assert not result
    with pytest.raises(AgentLoopValidationError) as raised:
        result.raise_if_invalid()
    assert codes(raised.value.errors) == ["GET_TOOLS_RETURNS_NONE"]
    assert str(raised.value).startswith("Agent loop validation failed with 1 error(s):\n  - [")
    assert str(ValidationError(code="C", message="m", field="f")) == "[C] f: m"
    assert str(ValidationError(code="C", message="m")) == "[C] m"


def test_name_problems_are_reported() -> None:
    class Odd:
        name = 5

        def get_tools(self, request: RolloutRequest) -> list[Any]:
            return []

        async def run(self, ctx: Any) -> None:
            return None

    assert codes(validate_agent_loop(Odd()).errors) == ["INVALID_NAME_TYPE"]
    blank = Odd()
    blank.name = "  "  # type: ignore[assignment]
    assert codes(validate_agent_loop(blank).errors) == ["EMPTY_NAME"]
