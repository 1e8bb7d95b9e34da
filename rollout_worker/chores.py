"""A worker's background chores (heartbeat, sweeper, revoke check, stop listener): named tasks
on its event loop, restarted after a failure, stopped within a bounded time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

logger = logging.getLogger(__name__)

STOP_SECONDS = 2.0


async def every(interval: float, action: Callable[[], Awaitable[object]]) -> None:
    """Run ``action`` every ``interval`` seconds for ever; a failure is logged, not fatal."""
    while True:
        try:
            await action()
        except Exception:
            logger.exception("%s failed; retrying in %.1fs", action.__qualname__, interval)
        await asyncio.sleep(interval)


class Chores:
    """Started together (call on the loop), stopped together."""

    def __init__(self, chores: Mapping[str, Coroutine[Any, Any, None]]) -> None:
        self._tasks = [asyncio.create_task(chore, name=name) for name, chore in chores.items()]

    @property
    def tasks(self) -> dict[str, asyncio.Task[None]]:
        return {task.get_name(): task for task in self._tasks}

    async def stop(self, grace: float = STOP_SECONDS) -> None:
        """Cancel every chore and wait for them, at most ``grace`` seconds: a cancellation
        swallowed inside a library call (seen in a sweep's Redis call, about one stop in ten)
        would otherwise keep its chore looping and the worker from exiting until SIGKILL."""
        for task in self._tasks:
            task.cancel()
        if not self._tasks:
            return
        _, ignored = await asyncio.wait(self._tasks, timeout=grace)
        for task in ignored:
            logger.warning("stopping: %s ignored its cancellation; left behind", task.get_name())


__all__ = ["STOP_SECONDS", "Chores", "every"]
