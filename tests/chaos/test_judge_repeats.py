"""The chaos audit's excuse for a repeated v1 callback can fail: each condition it needs,
taken away alone, makes the repeat count as a duplicate."""

from __future__ import annotations

from typing import Any

from tests.chaos.harness import Crash, judge_repeats

RECORDS = {"r1": "fleet:v1:r1", "r2": "fleet:v1:r2"}
FIRST = {"r1": 100.0, "r2": 100.0}
CALLBACK: dict[str, Any] = {"rollout_id": "r1", "status": "COMPLETED", "reward": 1.0}


def test_a_repeat_of_a_callback_that_arrived_before_its_holder_was_killed_is_excused() -> None:
    crash = Crash(held=frozenset({"fleet:v1:r1"}), at=100.5)
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [crash]) == (0, 1)


def test_a_repeat_without_any_kill_is_a_duplicate() -> None:
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, []) == (1, 0)


def test_a_repeat_of_a_rollout_the_killed_worker_did_not_hold_is_a_duplicate() -> None:
    crash = Crash(held=frozenset({"fleet:v1:r2"}), at=100.5)
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [crash]) == (1, 0)


def test_a_repeat_whose_first_callback_came_after_the_kill_is_a_duplicate() -> None:
    crash = Crash(held=frozenset({"fleet:v1:r1"}), at=99.5)
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [crash]) == (1, 0)


def test_a_repeat_that_differs_from_the_first_callback_is_a_duplicate() -> None:
    crash = Crash(held=frozenset({"fleet:v1:r1"}), at=100.5)
    other = {**CALLBACK, "reward": 0.0}
    assert judge_repeats({"r1": [CALLBACK, other]}, FIRST, RECORDS, [crash]) == (1, 0)
