"""CONFORMANCE §G items 50-55: the tool helpers' exact behaviour (S§1.9)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rollout_sdk.core.exceptions import ToolArgumentError
from rollout_sdk.tools import (
    create_tool_error_result,
    create_tool_result,
    execute_tool_calls,
    get_tool_call_info,
    parse_tool_arguments,
    serialize_tool_result,
)


def test_50_get_tool_call_info_parses_ids_names_and_arguments() -> None:
    call = {"id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}}
    assert get_tool_call_info(call) == ("c1", "add", {"a": 1})
    assert get_tool_call_info({"id": "c2", "function": {"name": "f", "arguments": {"x": 2}}}) == (
        "c2",
        "f",
        {"x": 2},
    )
    assert get_tool_call_info({"function": {"name": "f", "arguments": "{}"}})[0] == "unknown"
    assert get_tool_call_info({"id": "c3"}) == ("c3", "", {})


def test_51_bad_arguments_raise_with_the_call_identity() -> None:
    with pytest.raises(ToolArgumentError, match="Invalid JSON") as invalid:
        get_tool_call_info({"id": "c1", "function": {"name": "add", "arguments": "not json"}})
    assert (invalid.value.tool_call_id, invalid.value.tool_name) == ("c1", "add")
    with pytest.raises(ToolArgumentError, match="Expected dict") as not_object:
        get_tool_call_info({"id": "c9", "function": {"name": "mul", "arguments": "[1,2]"}})
    assert (not_object.value.tool_call_id, not_object.value.tool_name) == ("c9", "mul")


@pytest.mark.parametrize("arguments", [123, None, 1.5, ["a"]])
def test_52_parse_tool_arguments_rejects_other_types(arguments: Any) -> None:
    with pytest.raises(ToolArgumentError, match="Expected str or dict"):
        parse_tool_arguments(arguments)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42, "42"),
        (3.14, "3.14"),
        (0.0, "0.0"),
        ("x", "x"),
        ("", ""),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        ({"a": 1, "b": 2}, '{"a": 1, "b": 2}'),
        ([1, 2, 3], "[1, 2, 3]"),
    ],
)
def test_53_serialize_tool_result(value: Any, text: str) -> None:
    assert serialize_tool_result(value) == text


def test_53_serialize_tool_result_rejects_non_json_objects() -> None:
    with pytest.raises(TypeError):
        serialize_tool_result(object())


def test_54_tool_results() -> None:
    assert create_tool_error_result("c1", "boom") == {
        "role": "tool",
        "content": "Error: boom",
        "tool_call_id": "c1",
    }
    assert create_tool_result("c2", "") == {"role": "tool", "content": "", "tool_call_id": "c2"}


async def _sleepy(call: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0.2)
    return create_tool_result(call["id"], call["id"])


@pytest.mark.anyio
async def test_55_execute_tool_calls_runs_concurrently_in_input_order() -> None:
    calls = [{"id": f"c{i}"} for i in range(3)]
    started = time.monotonic()
    results = await execute_tool_calls(calls, _sleepy)
    assert time.monotonic() - started < 0.4  # three 0.2 s tools overlapped
    assert [r["content"] for r in results] == ["c0", "c1", "c2"]
    assert await execute_tool_calls([], _sleepy) == []
    assert await execute_tool_calls(None, _sleepy) == []


@pytest.mark.anyio
async def test_55_an_executor_exception_propagates() -> None:
    async def explode(call: dict[str, Any]) -> dict[str, Any]:
        raise ValueError(call["id"])

    with pytest.raises(ValueError, match="c0"):
        await execute_tool_calls([{"id": "c0"}], explode)
