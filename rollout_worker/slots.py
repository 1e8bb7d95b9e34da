"""A worker's rollout slots: how many rollouts it runs at once, and running one alone.

The intake takes a slot for each message it takes (``rollout_worker/intake.py``) and frees it
when the rollout's task ends. A rollout that must run with nothing beside it (a crash of its
worker may have been its own: ``rollout_worker/execution.py``) waits in :meth:`Slots.alone`
until every other rollout here has ended; meanwhile the intake takes nothing, and the
rollouts waiting to run alone take their turns one by one before it takes more.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class Slots:
    def __init__(self, count: int) -> None:
        self.count = count
        self._busy = 0  # slots held by rollouts running (or about to run) normally
        self._alone = 0  # rollouts waiting to run alone, or running alone (at most one)
        self._isolating = False  # one of them has its turn: no other rollout may start
        self._waiters: list[asyncio.Future[None]] = []

    def locked(self) -> bool:
        """No slot can be taken now."""
        return self._busy >= self.count or self._alone > 0

    async def take(self) -> None:
        """Wait for a free slot and take it."""
        await self._until(lambda: not self.locked())
        self._busy += 1

    def free(self) -> None:
        """Give a slot back (callable from a task's done callback)."""
        self._busy -= 1
        self._wake()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Run the body with no other rollout on this worker. The caller holds a slot; it
        waits for its turn without it (two rollouts waiting to run alone must not wait for
        each other's slot), and holds one again when the body ends, however it ends."""
        self._busy -= 1
        self._alone += 1
        self._wake()
        turn = False
        try:
            await self._until(lambda: not self._isolating)
            self._isolating = turn = True
            await self._until(lambda: self._busy == 0)
            yield
        finally:
            self._alone -= 1
            self._busy += 1
            if turn:
                self._isolating = False
            self._wake()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


__all__ = ["Slots"]
