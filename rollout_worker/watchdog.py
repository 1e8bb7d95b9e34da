"""Noticing an event loop that stopped turning.

An agent that makes a blocking call in async code (``time.sleep``, CPU-bound work, a sync
HTTP client) stops the worker's one event loop: every other rollout of the process starves,
and so does its lease heartbeat. A daemon thread pings the loop; a stall longer than
``warn_after`` is logged with the rollout that caused it and the loop thread's stack, and
one that reaches ``limit`` is handed to ``on_stall``, which recycles the worker.

A block is one task holding the loop (the same one running from the stall's first moments
to the limit); a loop that turns through many slow steps is overloaded, is reported, and left
alone. The culprit is found from the task the loop is stuck in: a task factory remembers which
task created each task, so a rollout's helper tasks lead back to the rollout's own task.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K")

PING_INTERVAL_SECONDS = 0.2


@dataclass(frozen=True)
class Stall:
    seconds: float
    key: str | None  # the record of the rollout the loop is stuck in, if it is stuck in one
    stack: str  # where the loop thread is


class TaskLineage:
    """Which task created which, so a helper task can be traced to its rollout's task."""

    def __init__(self) -> None:
        self._parents: weakref.WeakKeyDictionary[asyncio.Task[Any], asyncio.Task[Any]] = (
            weakref.WeakKeyDictionary()
        )

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        def factory(
            loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
        ) -> asyncio.Task[Any]:
            task = asyncio.Task(coro, loop=loop, **kwargs)
            parent = asyncio.current_task(loop)
            if parent is not None:
                self._parents[task] = parent
            return task

        loop.set_task_factory(factory)

    def root_in(
        self, task: asyncio.Task[Any] | None, roots: Mapping[K, asyncio.Task[Any]]
    ) -> K | None:
        """The key in ``roots`` of ``task`` or of the task that (indirectly) created it."""
        by_task = {id(root): key for key, root in roots.items()}
        while task is not None:
            if id(task) in by_task:
                return by_task[id(task)]
            task = self._parents.get(task)
        return None


class LoopWatchdog:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        loop_thread: threading.Thread,
        culprit: Callable[[asyncio.Task[Any] | None], str | None],
        on_stall: Callable[[Stall], None],
        limit: float,
        warn_after: float | None = None,
    ) -> None:
        self._loop = loop
        self._loop_thread = loop_thread
        self._culprit = culprit
        self._on_stall = on_stall
        self._limit = limit
        self._warn_after = warn_after if warn_after is not None else min(1.0, limit / 4)
        self._answered = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(PING_INTERVAL_SECONDS * 5)

    def _watch(self) -> None:
        while not self._stopped.wait(PING_INTERVAL_SECONDS):
            self._answered.clear()
            pinged_at = time.monotonic()
            self._loop.call_soon_threadsafe(self._answered.set)
            if self._answered.wait(self._warn_after):
                continue
            stall = self._observe(pinged_at)
            logger.warning(
                "event loop blocked for %.1fs so far, in rollout %s; loop thread at:\n%s",
                stall.seconds,
                stall.key or "(none)",
                stall.stack,
            )
            if self._held_by_one_task(pinged_at):
                self._on_stall(self._observe(pinged_at))
                return
            logger.warning(
                "event loop slow for %.1fs (rollout %s when it was noticed)",
                time.monotonic() - pinged_at,
                stall.key,
            )

    def _held_by_one_task(self, pinged_at: float) -> bool:
        """Whether one task holds the loop until the limit: a block. A loop that turns
        through many slow steps of many tasks is overloaded instead, and recycling would not
        help. (The running task is a dictionary lookup; sampling the loop thread's stack this
        often would cost the loop more than the stall.)"""
        holder = asyncio.current_task(self._loop)
        while not self._answered.wait(PING_INTERVAL_SECONDS / 4):
            if holder is None or asyncio.current_task(self._loop) is not holder:
                return False
            if time.monotonic() - pinged_at >= self._limit:
                return True
        return False

    def _observe(self, pinged_at: float) -> Stall:
        ident = self._loop_thread.ident
        frame = sys._current_frames().get(ident) if ident is not None else None
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)"
        key = self._culprit(asyncio.current_task(self._loop))
        return Stall(time.monotonic() - pinged_at, key, stack)


__all__ = ["LoopWatchdog", "Stall", "TaskLineage"]
