"""A worker's chores stop within a bounded time, apart from Celery and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from rollout_worker.chores import STOP_SECONDS, Chores


async def _swallows_cancellation() -> None:
    """A chore whose library call ate the cancellation (the sweeper's Redis call did); the
    second one ends it, so the test's loop can close."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    await asyncio.sleep(3600)


async def _plain_chore() -> None:
    await asyncio.sleep(3600)


def test_a_chore_ignoring_its_cancellation_does_not_hold_the_worker_at_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def stop() -> tuple[bool, bool]:
        chores = Chores({"stubborn": _swallows_cancellation(), "plain": _plain_chore()})
        stubborn, plain = chores.tasks["stubborn"], chores.tasks["plain"]
        await asyncio.sleep(0)
        await asyncio.wait_for(chores.stop(), timeout=STOP_SECONDS + 5)
        done = (stubborn.done(), plain.cancelled())
        stubborn.cancel()
        return done

    with caplog.at_level(logging.WARNING, logger="rollout_worker.chores"):
        assert asyncio.run(stop()) == (False, True)
    assert "stubborn ignored its cancellation" in caplog.text
