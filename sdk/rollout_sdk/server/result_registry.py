"""Results of rollouts in one process, awaited under a polling lease (upstream's
``osmosis_ai.rollout.server.result_registry``).

:class:`RolloutFutureRegistry` is the building block upstream's 0.3 server keeps its
rollouts in: one future per rollout id, resolved once with the final result, long-polled by
the lease holder, kept ``result_retention_sec`` after it resolves. A lease that runs out
resolves the future as ``failure / lease_expired`` and cancels the execution.

Our own in-process server (:mod:`rollout_sdk.server.rollout_server`) shares its leases
(:class:`~rollout_sdk.server.lease.LeaseManager`), errors and timeout rules with this
registry, but keeps its own table: its long-poll also returns on every intermediate status
change (PROTOCOL.md §2.4), and it keeps an id reserved until execution has stopped
(PROTOCOL.md §2.8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from rollout_sdk.server.lease import LeaseManager
from rollout_sdk.types.protocol import RolloutResultResponse, lease_expired_result
from rollout_sdk.types.sample import RolloutStatus

logger = logging.getLogger(__name__)


class UnknownRolloutError(KeyError):
    """The rollout id was never registered, or was evicted after retention."""


class DuplicateRolloutError(ValueError):
    """The rollout id is registered already (queued, running, or finished and retained)."""


def check_timeouts(
    result_wait_timeout_sec: float, polling_lease_timeout_sec: float, result_retention_sec: float
) -> None:
    """A server's timing rules (SDK.md §2.9): ``ValueError`` naming the first one broken."""
    if not (math.isfinite(result_wait_timeout_sec) and result_wait_timeout_sec > 0):
        raise ValueError("result_wait_timeout_sec must be finite and greater than zero")
    if not (math.isfinite(result_retention_sec) and result_retention_sec >= 0):
        raise ValueError("result_retention_sec must be finite and non-negative")
    if not (
        math.isfinite(polling_lease_timeout_sec)
        and polling_lease_timeout_sec > result_wait_timeout_sec
    ):
        raise ValueError(
            "polling_lease_timeout_sec must be finite and exceed result_wait_timeout_sec"
        )


@dataclass
class RolloutFuture:
    """One registered rollout: its last known status, its final result (once resolved),
    the task executing it and the task that evicts it after retention."""

    rollout_id: str
    result: asyncio.Future[RolloutResultResponse]
    status: RolloutStatus = RolloutStatus.QUEUED
    task: asyncio.Task[None] | None = None
    cleanup_task: asyncio.Task[None] | None = None


class RolloutFutureRegistry:
    """Registered rollouts by id; ``cancel_rollout(rollout_id)`` is told to stop an
    execution whose lease expired."""

    def __init__(
        self,
        *,
        result_wait_timeout_sec: float,
        polling_lease_timeout_sec: float,
        result_retention_sec: float,
        cancel_rollout: Callable[[str], None],
    ) -> None:
        check_timeouts(result_wait_timeout_sec, polling_lease_timeout_sec, result_retention_sec)
        self.result_wait_timeout_sec = result_wait_timeout_sec
        self.result_retention_sec = result_retention_sec
        self.cancel_rollout = cancel_rollout
        self.entries: dict[str, RolloutFuture] = {}
        self.lock = asyncio.Lock()
        self.leases = LeaseManager(timeout_sec=polling_lease_timeout_sec, on_expired=self.expire)

    def entry(self, rollout_id: str) -> RolloutFuture:
        entry = self.entries.get(rollout_id)
        if entry is None:
            raise UnknownRolloutError(rollout_id)
        return entry

    @staticmethod
    def lease_failure(rollout_id: str) -> RolloutResultResponse:
        return lease_expired_result(rollout_id)

    # --- lifecycle ----------------------------------------------------------------------

    async def register(self, rollout_id: str, lease_token: str) -> None:
        """Register a new rollout under its lease; ``DuplicateRolloutError`` if known."""
        async with self.lock:
            if rollout_id in self.entries:
                raise DuplicateRolloutError(rollout_id)
            future = asyncio.get_running_loop().create_future()
            self.entries[rollout_id] = RolloutFuture(rollout_id, future)
            self.leases.register(rollout_id, lease_token)

    async def bind_task(self, rollout_id: str, task: asyncio.Task[None]) -> None:
        async with self.lock:
            self.entry(rollout_id).task = task

    async def discard(self, rollout_id: str) -> None:
        """Forget a rollout at once (e.g. its admission failed after registering)."""
        async with self.lock:
            if self.entries.pop(rollout_id, None) is not None:
                self.leases.remove(rollout_id)

    async def set_status(self, rollout_id: str, status: RolloutStatus) -> None:
        """Record an intermediate status; ignored once the result is in."""
        async with self.lock:
            entry = self.entry(rollout_id)
            if not entry.result.done():
                entry.status = status

    async def complete(self, rollout_id: str, response: RolloutResultResponse) -> bool:
        """Resolve the rollout with ``response``. False when it was resolved already, or
        when its lease had run out (then it resolves as lease-expired instead)."""
        async with self.lock:
            entry = self.entry(rollout_id)
            if entry.result.done():
                return False
            expired = self.leases.expired(rollout_id)
            self.finish(entry, self.lease_failure(rollout_id) if expired else response)
        if expired:
            self.cancel_execution(rollout_id, entry.task)
        return not expired

    async def expire(self, rollout_id: str) -> None:
        """The lease ran out (``LeaseManager`` calls this): resolve as lease-expired and stop
        the execution, unless the result is in or the lease was renewed meanwhile."""
        async with self.lock:
            entry = self.entries.get(rollout_id)
            if entry is None or entry.result.done() or not self.leases.expired(rollout_id):
                return
            self.finish(entry, self.lease_failure(rollout_id))
        self.cancel_execution(rollout_id, entry.task)

    def finish(self, entry: RolloutFuture, response: RolloutResultResponse) -> None:
        """Resolve ``entry`` (under the lock) and schedule its eviction after retention."""
        entry.status = response.status
        entry.result.set_result(response)
        self.leases.finish(entry.rollout_id)
        entry.cleanup_task = asyncio.create_task(self.remove_after_retention(entry))

    async def remove_after_retention(self, entry: RolloutFuture) -> None:
        await asyncio.sleep(self.result_retention_sec)
        async with self.lock:
            if self.entries.get(entry.rollout_id) is entry:
                del self.entries[entry.rollout_id]
                self.leases.remove(entry.rollout_id)

    def cancel_execution(self, rollout_id: str, task: asyncio.Task[None] | None) -> None:
        """Cancel the executing task (unless it is the caller) and tell ``cancel_rollout``."""
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
        try:
            self.cancel_rollout(rollout_id)
        except Exception:
            logger.exception("cancelling the execution of rollout %s failed", rollout_id)

    async def close(self) -> None:
        """Stop the lease watchers and pending evictions."""
        async with self.lock:
            cleanups = [e.cleanup_task for e in self.entries.values() if e.cleanup_task]
        await self.leases.close()
        for task in cleanups:
            task.cancel()
        await asyncio.gather(*cleanups, return_exceptions=True)

    # --- polling ------------------------------------------------------------------------

    async def wait_for_result(
        self,
        rollout_id: str,
        lease_token: str,
        current_status: Callable[[], RolloutStatus],
    ) -> RolloutResultResponse:
        """One long-poll: authenticate (renewing the lease while the rollout runs), then wait
        up to ``result_wait_timeout_sec`` for the final result; on timeout answer the
        ``current_status()``. A poll after the deadline resolves the rollout as expired."""
        expired_task: asyncio.Task[None] | None = None
        async with self.lock:
            entry = self.entry(rollout_id)
            if entry.result.done():
                self.leases.authenticate(rollout_id, lease_token)
            elif not self.leases.renew(rollout_id, lease_token):
                self.finish(entry, self.lease_failure(rollout_id))
                expired_task = entry.task
            future = entry.result
        if expired_task is not None:
            self.cancel_execution(rollout_id, expired_task)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.result_wait_timeout_sec):
                return await asyncio.shield(future)
        async with self.lock:
            entry = self.entry(rollout_id)
            self.leases.authenticate(rollout_id, lease_token)
            if entry.result.done():
                return entry.result.result()
            entry.status = current_status()
            return RolloutResultResponse(rollout_id=rollout_id, status=entry.status)


__all__ = [
    "DuplicateRolloutError",
    "RolloutFuture",
    "RolloutFutureRegistry",
    "UnknownRolloutError",
    "check_timeouts",
]
