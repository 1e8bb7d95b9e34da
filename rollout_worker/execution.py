"""Executing rollouts in a worker process: claim → carry (protocol-specific) → finish.

The executor owns what every protocol shares: the claim that makes duplicate deliveries
harmless, the per-process slot limit, the lease heartbeat, and cancelling a rollout's task
when its lease is lost. What "running a rollout" means (v1: run the agent loop, post the
completion callback) is a :class:`Carrier`, looked up by the record's protocol.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rollout_worker.records import Claim, RecordStore, Status
from rollout_worker.settings import FleetSettings

logger = logging.getLogger(__name__)

LEASE_LOST = "lease lost"


@dataclass(frozen=True)
class Lease:
    """This worker's hold on one rollout; every state change through it checks ownership."""

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
    ) -> None:
        self.store = store
        self.owner = owner
        self._settings = settings
        self._carriers = carriers
        # Celery's pool size is the real cap; this guards the loop if the two ever disagree.
        self._slots = asyncio.Semaphore(concurrency)
        self._running: dict[str, asyncio.Task[Any]] = {}

    @property
    def held(self) -> list[str]:
        return list(self._running)

    async def execute(self, record: str) -> str:
        """Run one delivery of ``rollout.run``; returns a short outcome for Flower."""
        claim = await self.store.claim(
            record,
            self.owner,
            int(self._settings.lease_seconds * 1000),
            self._settings.max_attempts,
        )
        if not claim.acquired:
            logger.info("%s: not run (%s)", record, claim.verdict)
            return claim.verdict.value
        task = asyncio.current_task()
        assert task is not None
        self._running[record] = task
        carrier = self._carriers[claim.record["protocol"]]
        lease = Lease(self.store, record, self.owner, carrier.retention_ms)
        try:
            async with self._slots:
                status = await carrier.carry(claim, lease)
        finally:
            self._running.pop(record, None)
        return status.value if status is not None else LEASE_LOST

    def cancel(self, record: str) -> bool:
        task = self._running.get(record)
        if task is None:
            return False
        task.cancel()
        return True

    async def renew_leases(self) -> None:
        """Extend the leases of every rollout running here; cancel the ones we lost."""
        lost = await self.store.renew(
            self.owner,
            self.held,
            int(self._settings.lease_seconds * 1000),
            int(self._settings.inflight_ttl_seconds * 1000),
        )
        for record in lost:
            if self.cancel(record):
                logger.warning("%s: lease lost to another worker; stopped here", record)


__all__ = ["LEASE_LOST", "Carrier", "Executor", "Lease"]
