"""CONFORMANCE §G item 61: @osmosis_reward (S§1.13).

The reward functions keep the seed docs' ``extra_info: dict = None`` spelling on purpose.
"""

# ruff: noqa: RUF013

from __future__ import annotations

from typing import Any, Optional

import pytest

from rollout_sdk import osmosis_reward


def test_61_a_classic_reward_function_works() -> None:
    @osmosis_reward
    def reward(solution_str: str, ground_truth: str, extra_info: dict = None, **kw: Any) -> float:  # type: ignore[assignment,type-arg]
        return 1.0 if solution_str == ground_truth else 0.0

    assert reward("42", "42") == 1.0
    assert reward("4", "42", data_source="gsm8k") == 0.0
    assert reward.__name__ == "reward"


@pytest.mark.parametrize("annotation", [dict, "dict | None", Optional[dict], dict[str, Any] | None])  # noqa: UP045
def test_61_extra_info_may_be_any_dictish_annotation(annotation: Any) -> None:
    def reward(solution_str: str, ground_truth: str, extra_info=None) -> float:  # type: ignore[no-untyped-def]
        return 0.5

    reward.__annotations__["extra_info"] = annotation
    assert osmosis_reward(reward)("a", "b") == 0.5


def test_61_missing_extra_info_default_or_wrong_annotations_fail_at_decoration() -> None:
    with pytest.raises(TypeError, match="default"):

        @osmosis_reward
        def no_default(solution_str: str, ground_truth: str, extra_info: dict) -> float:  # type: ignore[type-arg]
            return 0.0

    with pytest.raises(TypeError, match="ground_truth"):

        @osmosis_reward
        def wrong_truth(solution_str: str, ground_truth: int, extra_info: dict = None) -> float:  # type: ignore[assignment,type-arg]
            return 0.0

    with pytest.raises(TypeError, match="solution_str"):

        @osmosis_reward
        def unannotated(solution_str, ground_truth: str, extra_info: dict = None) -> float:  # type: ignore[no-untyped-def,assignment,type-arg]
            return 0.0

    with pytest.raises(TypeError, match="must take"):

        @osmosis_reward
        def too_few(solution_str: str, ground_truth: str) -> float:
            return 0.0


def test_61_returning_an_int_fails_at_call_time() -> None:
    @osmosis_reward
    def reward(solution_str: str, ground_truth: str, extra_info: dict = None, **kw: Any) -> float:  # type: ignore[assignment,type-arg]
        return 1  # type: ignore[return-value]

    with pytest.raises(TypeError, match="must return a float, got int"):
        reward("a", "b")


def test_data_source_is_dropped_unless_accepted() -> None:
    @osmosis_reward
    def strict(solution_str: str, ground_truth: str, extra_info: dict = None) -> float:  # type: ignore[assignment,type-arg]
        return 0.25

    assert strict("a", "b", data_source="x") == 0.25

    @osmosis_reward
    def other(messages: list[Any], data_source: str = "") -> str:
        return data_source

    assert other([], data_source="kept") == "kept"


@pytest.mark.anyio
async def test_async_reward_functions_are_checked_too() -> None:
    @osmosis_reward
    async def reward(
        solution_str: str, ground_truth: str, extra_info: dict = None, **kw: Any
    ) -> float:  # type: ignore[assignment,type-arg]
        return 1.0

    assert await reward("a", "a") == 1.0
