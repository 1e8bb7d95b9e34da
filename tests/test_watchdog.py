"""The loop watchdog: a blocked event loop is noticed, blamed on the rollout blocking it (even
from a helper task that rollout created) and handed on, while a busy-but-turning loop is not."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from rollout_core.settings import FleetSettings
from rollout_core.store.schema import Keys
from rollout_worker.loop import LoopThread
from rollout_worker.watchdog import LoopWatchdog, Stall, TaskLineage

STUCK = Keys("rf").record("v2", "stuck")


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    thread.start()
    yield thread
    thread.stop()


def watch(
    loop_thread: LoopThread, roots: dict[str, asyncio.Task[None]]
) -> tuple[LoopWatchdog, list[Stall], threading.Event]:
    lineage = TaskLineage()
    lineage.install(loop_thread.loop)
    stalls: list[Stall] = []
    stalled = threading.Event()

    def on_stall(stall: Stall) -> None:
        stalls.append(stall)
        stalled.set()

    watchdog = LoopWatchdog(
        loop_thread.loop,
        loop_thread.thread,
        culprit=lambda task: lineage.root_in(task, roots),
        on_stall=on_stall,
        limit=1.0,
        warn_after=0.3,
    )
    return watchdog, stalls, stalled


def blocking_agent_step() -> None:
    time.sleep(2.5)


def test_a_blocking_helper_task_is_blamed_on_its_rollout(loop_thread: LoopThread) -> None:
    roots: dict[str, asyncio.Task[None]] = {}
    watchdog, stalls, stalled = watch(loop_thread, roots)

    async def rollout() -> None:
        async def helper() -> None:
            await asyncio.sleep(0.3)
            blocking_agent_step()

        await asyncio.create_task(helper())

    async def start() -> None:
        roots[STUCK] = asyncio.create_task(rollout())
        roots[Keys("rf").record("v2", "innocent")] = asyncio.create_task(asyncio.sleep(10))

    loop_thread.run(start())
    watchdog.start()
    assert stalled.wait(5)
    watchdog.stop()
    for task in roots.values():
        loop_thread.loop.call_soon_threadsafe(task.cancel)
    (stall,) = stalls
    assert stall.key == STUCK
    assert stall.seconds >= 1.0
    assert "blocking_agent_step" in stall.stack


def test_a_short_block_is_only_reported(
    loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    watchdog, stalls, _ = watch(loop_thread, {})
    watchdog.start()
    time.sleep(0.3)
    loop_thread.loop.call_soon_threadsafe(time.sleep, 0.6)
    time.sleep(1.5)
    watchdog.stop()
    assert stalls == []
    assert "event loop blocked for" in caplog.text


def test_an_overloaded_loop_that_still_turns_is_not_recycled(
    loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """Many short sync steps (a CPU-heavy framework under load) delay the ping past the limit,
    but no single callback holds the loop: recycling would not help, so it is only reported."""
    watchdog, stalls, _ = watch(loop_thread, {})

    async def cpu_heavy_step() -> None:
        time.sleep(0.1)  # noqa: ASYNC251 - the point: steps that hold the loop a while

    def start_many() -> None:
        for _ in range(40):
            loop_thread.loop.create_task(cpu_heavy_step())

    watchdog.start()
    time.sleep(0.3)
    loop_thread.loop.call_soon_threadsafe(start_many)
    time.sleep(5)
    watchdog.stop()
    assert stalls == []
    assert "event loop slow for" in caplog.text


def test_the_stall_limit_must_be_below_the_lease() -> None:
    """Other workers take a silent worker's rollouts when its lease lapses; the watchdog must
    act first."""
    with pytest.raises(ValidationError, match="loop_stall_seconds must be below"):
        FleetSettings(lease_seconds=10, loop_stall_seconds=10)
    assert FleetSettings(lease_seconds=15).loop_stall_limit == 10
