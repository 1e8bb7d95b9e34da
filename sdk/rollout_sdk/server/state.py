"""``AppState``: the bookkeeping of the in-process v1 server (upstream's
``osmosis_ai.rollout.server.state``).

It bounds concurrent rollouts, makes admission idempotent (the first request for a key
computes the init response, duplicates await the same one), remembers finished rollouts for
``record_ttl`` seconds and forgets them after that, and cancels what still runs at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from rollout_sdk.config import RolloutServerSettings, get_settings
from rollout_sdk.core.schemas import InitResponse


class AppState:
    """Per-app state: ``rollout_tasks`` (running, by key), ``completed_rollouts`` (key →
    monotonic finish time), ``semaphore`` (the concurrency cap). Unset limits come from the
    server settings."""

    def __init__(
        self,
        max_concurrent: int | None = None,
        record_ttl_seconds: float | None = None,
        cleanup_interval_seconds: float | None = None,
        settings: RolloutServerSettings | None = None,
        agent_loop_name: str = "default",
    ) -> None:
        self.settings = settings or get_settings().server
        self.max_concurrent = max_concurrent or self.settings.max_concurrent_rollouts
        self.record_ttl = record_ttl_seconds or self.settings.record_ttl_seconds
        self.cleanup_interval = cleanup_interval_seconds or self.settings.cleanup_interval_seconds
        self.agent_loop_name = agent_loop_name
        self.rollout_tasks: dict[str, asyncio.Task[None]] = {}
        self.completed_rollouts: dict[str, float] = {}
        self.semaphore = asyncio.Semaphore(self.max_concurrent)
        self._init_futures: dict[str, asyncio.Future[InitResponse]] = {}
        self._cleanup_task: asyncio.Task[None] | None = None

    # --- idempotent admission -----------------------------------------------------------

    def get_or_create_init_future(self, key: str) -> tuple[asyncio.Future[InitResponse], bool]:
        """``(future, created)``: the caller that created it computes the init response and
        resolves it; every other caller awaits it."""
        future = self._init_futures.get(key)
        if future is not None:
            return future, False
        future = asyncio.get_running_loop().create_future()
        self._init_futures[key] = future
        return future, True

    def clear_init_record(self, key: str) -> None:
        """Forget a key's init response (its admission failed: a retry is a new rollout)."""
        self._init_futures.pop(key, None)

    def is_duplicate(self, key: str) -> bool:
        """The key is being admitted, running, or finished within the record TTL."""
        return (
            key in self._init_futures or key in self.rollout_tasks or key in self.completed_rollouts
        )

    # --- running and finished rollouts --------------------------------------------------

    def mark_started(self, key: str, task: asyncio.Task[None]) -> None:
        self.rollout_tasks[key] = task

    def mark_completed(self, key: str) -> None:
        self.rollout_tasks.pop(key, None)
        self.completed_rollouts[key] = time.monotonic()

    @property
    def active_count(self) -> int:
        return len(self.rollout_tasks)

    @property
    def completed_count(self) -> int:
        return len(self.completed_rollouts)

    def prune_completed_records(self) -> None:
        """Forget rollouts finished more than ``record_ttl`` seconds ago (their keys admit
        new rollouts again)."""
        horizon = time.monotonic() - self.record_ttl
        for key in [k for k, at in self.completed_rollouts.items() if at < horizon]:
            del self.completed_rollouts[key]
            self._init_futures.pop(key, None)

    async def cancel_all(self) -> None:
        """Cancel every running rollout and wait for them to unwind."""
        tasks = list(self.rollout_tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.rollout_tasks.clear()

    # --- record cleanup -----------------------------------------------------------------

    def start_cleanup_task(self) -> None:
        """Prune finished records every ``cleanup_interval`` seconds (call at startup)."""
        if self._cleanup_task is None or self._cleanup_task.done():
            self._cleanup_task = asyncio.create_task(self._cleanup_forever())

    async def stop_cleanup_task(self) -> None:
        if self._cleanup_task is not None:
            self._cleanup_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cleanup_task
            self._cleanup_task = None

    async def _cleanup_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cleanup_interval)
            self.prune_completed_records()


__all__ = ["AppState"]
