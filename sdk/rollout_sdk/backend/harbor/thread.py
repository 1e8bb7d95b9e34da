"""Harbor's own event loop, in a thread of its own.

Harbor does some work synchronously inside its coroutines: it reads a reward file whole, scrubs
every file of a trial's folder for secrets, parses YAML, runs a few engine probes with
``subprocess.run``. What a sandbox writes decides how long some of that takes, and on the
worker's loop it would stall heartbeats, leases and every other rollout (and the worker's
watchdog would recycle the worker, blaming the agent). So trials run on this loop; the worker's
loop only awaits them. A cancel reaches the trial on Harbor's loop, and the caller waits for the
trial's own clean-up before it goes on.

Start: on first use. Stop: never needed (a daemon thread; the process's exit ends it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

CLEAN_UP_SECONDS = 120.0  # how long a cancelled trial gets to take down its sandbox


class _HarborLoop:
    """One loop per process, started by the first trial."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="harbor-loop", daemon=True)
                thread.start()
                self._loop = loop
            return self._loop


_harbor = _HarborLoop()


async def on_harbor_loop[T](work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on Harbor's loop and wait for it; cancelling the caller cancels it there
    and waits (up to :data:`CLEAN_UP_SECONDS`) until it has finished cleaning up."""
    caller = asyncio.get_running_loop()
    finished = asyncio.Event()

    async def tracked() -> T:
        try:
            return await work
        finally:
            caller.call_soon_threadsafe(finished.set)

    future = asyncio.run_coroutine_threadsafe(tracked(), _harbor.get())
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.cancel()
        try:
            async with asyncio.timeout(CLEAN_UP_SECONDS):
                await finished.wait()
        except (TimeoutError, asyncio.CancelledError):
            pass
        raise


__all__ = ["on_harbor_loop"]
