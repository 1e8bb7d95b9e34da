"""One long-lived asyncio event loop per worker process, running in a daemon thread.

Celery's worker keeps the main thread (revokes, heartbeats, task events); everything a
rollout does runs on this loop: the intake takes messages and runs them here
(``intake.py``). All rollouts of the process share the loop and with it one HTTP connection
pool and one Redis pool (celery-notes §1.2: half the memory and twice the speed of a loop
per task). The loop is uvloop's: its I/O and scheduling run in C.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "rollout-loop") -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it (from any other thread)."""
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)


__all__ = ["LoopThread"]
