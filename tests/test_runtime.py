"""The worker runtime's own shutdown, apart from Celery and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from celery import Celery

from rollout_worker.runtime import BACKGROUND_STOP_SECONDS, WorkerRuntime
from rollout_worker.settings import FleetSettings


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
    runtime = WorkerRuntime(FleetSettings(), Celery(), agent=None, concurrency=1)  # type: ignore[arg-type]

    async def close() -> tuple[bool, bool]:
        stubborn = asyncio.create_task(_swallows_cancellation(), name="stubborn")
        plain = asyncio.create_task(_plain_chore(), name="plain")
        runtime._background = [stubborn, plain]
        await asyncio.sleep(0)
        await asyncio.wait_for(runtime._close(), timeout=BACKGROUND_STOP_SECONDS + 5)
        done = (stubborn.done(), plain.cancelled())
        stubborn.cancel()
        return done

    with caplog.at_level(logging.WARNING, logger="rollout_worker.runtime"):
        assert asyncio.run(close()) == (False, True)
    assert "stubborn ignored its cancellation" in caplog.text
