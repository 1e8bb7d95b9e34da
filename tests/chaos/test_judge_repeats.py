"""The chaos audit's excuse for a repeated v1 callback can fail: each condition it needs,
taken away alone, makes the repeat count as a duplicate. A repeat needs a kill of its own, of
a worker holding the rollout, from a second before the callback it repeats arrived to the
repeat window (the chaos fleet's client timeout and a second) after it."""

from __future__ import annotations

from typing import Any

from tests.chaos.harness import CHAOS_ENV, REPEAT_SLACK, Crash, Timings, judge_repeats

RECORDS = {"r1": "fleet:v1:r1", "r2": "fleet:v1:r2"}
FIRST = {"r1": [100.0], "r2": [100.0]}
CALLBACK: dict[str, Any] = {"rollout_id": "r1", "status": "COMPLETED", "reward": 1.0}
WINDOW = Timings.of(CHAOS_ENV).repeat_window  # 3 s: a 2 s client timeout and a second
HELD = frozenset({"fleet:v1:r1"})


def test_the_repeat_window_is_the_chaos_fleets_client_timeout_and_a_second() -> None:
    timeout = float(CHAOS_ENV["OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS"])
    assert timeout + REPEAT_SLACK == WINDOW


def test_a_repeat_of_a_callback_that_arrived_before_its_holder_was_killed_is_excused() -> None:
    crash = Crash(held=HELD, at=100.5)
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [crash], WINDOW) == (0, 1)


def test_a_kill_just_before_the_callback_arrived_excuses_its_repeat() -> None:
    """A request written whole reaches the trainer after its worker died."""
    crash = Crash(held=HELD, at=100.0 - REPEAT_SLACK + 0.1)
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [crash], WINDOW) == (0, 1)


def test_a_repeat_without_any_kill_is_a_duplicate() -> None:
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [], WINDOW) == (1, 0)


def test_a_repeat_of_a_rollout_the_killed_worker_did_not_hold_is_a_duplicate() -> None:
    crash = Crash(held=frozenset({"fleet:v1:r2"}), at=100.5)
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [crash], WINDOW) == (1, 0)


def test_a_repeat_whose_first_callback_came_well_after_the_kill_is_a_duplicate() -> None:
    crash = Crash(held=HELD, at=100.0 - REPEAT_SLACK - 0.5)
    assert judge_repeats({"r1": [CALLBACK, CALLBACK]}, FIRST, RECORDS, [crash], WINDOW) == (1, 0)


def test_a_repeat_that_differs_from_the_first_callback_is_a_duplicate() -> None:
    crash = Crash(held=HELD, at=100.5)
    other = {**CALLBACK, "reward": 0.0}
    assert judge_repeats({"r1": [CALLBACK, other]}, FIRST, RECORDS, [crash], WINDOW) == (1, 0)


def test_a_kill_after_the_repeat_window_excuses_nothing() -> None:
    """The worker that posted the first callback had recorded the answer by then."""
    for late in (100.0 + WINDOW + 0.5, 400.0):
        crash = Crash(held=HELD, at=late)
        calls = {"r1": [CALLBACK, CALLBACK]}
        assert judge_repeats(calls, FIRST, RECORDS, [crash], WINDOW) == (1, 0), late


def test_one_kill_excuses_one_repeat_only() -> None:
    """Three identical callbacks: one kill in the first one's window excuses one repeat; a
    kill 300 s later (formerly enough to excuse both) excuses none."""
    calls = {"r1": [CALLBACK, CALLBACK, CALLBACK]}
    arrivals = {"r1": [100.0, 105.0, 110.0]}
    assert judge_repeats(calls, arrivals, RECORDS, [Crash(HELD, 100.5)], WINDOW) == (1, 1)
    assert judge_repeats(calls, arrivals, RECORDS, [Crash(HELD, 400.0)], WINDOW) == (2, 0)
    twice_in_one_window = [Crash(HELD, 100.5), Crash(HELD, 101.0)]
    assert judge_repeats(calls, arrivals, RECORDS, twice_in_one_window, WINDOW) == (1, 1)


def test_each_repeat_is_excused_by_a_kill_around_the_callback_it_repeats() -> None:
    """The first callback's poster killed, the rollout taken over, its new holder killed
    after posting the second: two kills, two repeats excused."""
    calls = {"r1": [CALLBACK, CALLBACK, CALLBACK]}
    arrivals = {"r1": [100.0, 105.0, 110.0]}
    crashes = [Crash(HELD, 100.5), Crash(HELD, 105.5)]
    assert judge_repeats(calls, arrivals, RECORDS, crashes, WINDOW) == (0, 2)


def test_the_audit_waits_long_enough_for_an_attempt_under_way_as_its_record_ended() -> None:
    """A callback attempt whose lease check passed just before its record ended (a stale
    execution's) arrives within the client timeout; takeovers come before their record ends."""
    timings = Timings.of(CHAOS_ENV)
    assert timings.settle > timings.client_timeout + 1
