"""Executing rollouts in a worker process: claim → carry (protocol-specific) → finish.

The executor owns what every protocol shares: the claim that makes duplicate deliveries
harmless, the per-process slot limit, the lease heartbeat, cancelling a rollout's task when
its lease is lost, and handing rollouts back when the worker stops. What "running a rollout"
means (v1: run the agent loop, post the completion callback) is a :class:`Carrier`, looked up
by the record's protocol.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError

from rollout_worker import logs, metrics, tracing
from rollout_worker.records import Claim, RecordStore, Status, Verdict
from rollout_worker.settings import FleetSettings
from rollout_worker.trajectories import TrajectorySink

logger = logging.getLogger(__name__)

LEASE_LOST = "lease lost"
HANDED_BACK = "handed back"


def time_limit_message(seconds: float) -> str:
    return (
        f"rollout ran longer than the fleet's limit of {seconds:g}s "
        "(ROLLOUT_FLEET_MAX_ROLLOUT_SECONDS)"
    )


@dataclass(frozen=True)
class Lease:
    """One execution's hold on one rollout; every state change through it checks ownership.

    The owner names the execution, not the worker process: when a lease lapses while its
    execution still runs and the same process claims the rollout again, the stale execution
    must not be able to renew, finish or hand back the new one.
    """

    store: RecordStore
    record: str
    owner: str
    retention_ms: int

    async def advance(self, status: Status, *, result: str = "", **fields: Any) -> bool:
        """Move the rollout to ``status``; False if the lease was lost (result discarded)."""
        return await self.store.finish(
            self.record,
            self.owner,
            status,
            result=result,
            ttl_ms=self.retention_ms,
            fields=fields,
        )


class Carrier(Protocol):
    """Takes one claimed rollout of a protocol to a terminal status.

    Returns that status, or ``None`` when the lease was lost on the way (the rollout now
    belongs to another worker, or was finished for it, and this one's result was discarded).
    """

    retention_ms: int  # how long a finished record of this protocol is kept

    async def carry(self, claim: Claim, lease: Lease) -> Status | None: ...


class Executor:
    def __init__(
        self,
        store: RecordStore,
        owner: str,
        settings: FleetSettings,
        carriers: Mapping[str, Carrier],
        concurrency: int,
        requeue_message: Callable[[str], str],
        sink: TrajectorySink | None = None,
    ) -> None:
        self.store = store
        self._sink = sink
        self.owner = owner
        self._settings = settings
        self._carriers = carriers
        self._requeue_message = requeue_message
        # Celery's pool size is the real cap; this guards the loop if the two ever disagree.
        self._slots = asyncio.Semaphore(concurrency)
        self._executions: dict[str, _Execution] = {}  # by lease owner
        self._stopping = False

    @property
    def held(self) -> list[str]:
        return list(self.leases)

    @property
    def leases(self) -> dict[str, str]:
        """record → lease owner of every rollout running here (the newest execution's)."""
        return {e.record: owner for owner, e in list(self._executions.items())}

    @property
    def running(self) -> dict[str, asyncio.Task[Any]]:
        """Each running rollout's task (a copy: the loop-watchdog thread reads it too)."""
        return {e.record: e.task for e in list(self._executions.values())}

    async def execute(self, record: str) -> str:
        """Run one delivery of ``rollout.run``; returns a short outcome for Flower."""
        with logs.about(self.store.keys.rollout_key(record)):
            return await self._execute(record)

    async def _execute(self, record: str) -> str:
        owner = f"{self.owner}:{uuid.uuid4().hex[:8]}"
        claim = await self.store.claim(
            record,
            owner,
            self.owner,
            int(self._settings.lease_seconds * 1000),
            self._settings.max_attempts,
        )
        if not claim.acquired:
            logger.info("%s: not run (%s)", record, claim.verdict)
            return claim.verdict.value
        if self._stopping and await self._release(record, owner):
            return HANDED_BACK
        task = asyncio.current_task()
        assert task is not None
        self._executions[owner] = _Execution(record, task)
        protocol = claim.record["protocol"]
        if claim.attempt == 1 and claim.verdict is Verdict.RUNNING:
            metrics.QUEUE_WAIT.labels(protocol).observe(claim.ms_since_accepted / 1000)
        carrier = self._carriers[protocol]
        lease = Lease(self.store, record, owner, carrier.retention_ms)
        started = time.monotonic()
        metrics.INFLIGHT.inc()
        try:
            async with self._slots:
                with tracing.execution(claim.record, self.store.keys.rollout_key(record)):
                    status = await carrier.carry(claim, lease)
        finally:
            metrics.INFLIGHT.dec()
            del self._executions[owner]
        if status is None:
            return LEASE_LOST
        metrics.DURATION.labels(protocol, status.value).observe(time.monotonic() - started)
        if self._sink is not None:
            await self._keep_trajectory(record)
        return status.value

    async def _keep_trajectory(self, record: str) -> None:
        assert self._sink is not None
        try:
            await self._sink.write(record)
        except (OSError, RedisError) as exc:  # the rollout is done either way
            logger.warning("%s: trajectory not written to the sink: %r", record, exc)

    async def hand_back(self, grace_seconds: float) -> int:
        """The worker is stopping: let running rollouts finish for ``grace_seconds``, then
        hand the rest back to the queue, where another worker takes them at once. Rollouts
        claimed from now on are handed back straight away. Returns how many went back."""
        self._stopping = True
        if self._executions:
            tasks = [e.task for e in self._executions.values()]
            await asyncio.wait(tasks, timeout=grace_seconds)
        handed = 0
        for owner, execution in list(self._executions.items()):
            # Released first: whatever the cancelled task writes afterwards is refused.
            if await self._release(execution.record, owner):
                execution.task.cancel()
                handed += 1
        metrics.REQUEUES.labels("handed_back").inc(handed)
        return handed

    async def _release(self, record: str, owner: str) -> bool:
        return await self.store.release(record, owner, self._requeue_message(record))

    def cancel(self, record: str) -> bool:
        """Stop every execution of ``record`` here; False if none runs."""
        tasks = [e.task for e in self._executions.values() if e.record == record]
        for task in tasks:
            task.cancel()
        return bool(tasks)

    async def renew_leases(self) -> None:
        """Extend the lease of every execution running here; cancel the ones that lost it."""
        lost = await self.store.renew(
            {owner: e.record for owner, e in self._executions.items()},
            int(self._settings.lease_seconds * 1000),
            int(self._settings.inflight_ttl_seconds * 1000),
        )
        for owner in lost:
            execution = self._executions.get(owner)
            if execution is not None:
                execution.task.cancel()
                metrics.WORKER_LEASES_LOST.inc()
                logger.warning("%s: lease lost; its execution here stopped", execution.record)


@dataclass(frozen=True)
class _Execution:
    record: str
    task: asyncio.Task[Any]


__all__ = ["HANDED_BACK", "LEASE_LOST", "Carrier", "Executor", "Lease", "time_limit_message"]
