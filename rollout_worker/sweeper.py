"""Periodic recovery, run by every worker process.

* A rollout whose worker lease lapsed (its worker died) goes back to the front of the queue;
  with the default 15 s lease and 5 s sweep it runs again elsewhere within about 20 s, long
  before the broker's visibility timeout would redeliver it. Not in the first lease after a
  Redis restart: leases lapsed then because nobody could renew them, and their live owners
  get one lease to renew before anyone takes over (a takeover of a rollout delivering its
  v1 callback would post that callback twice).
* A rollout whose message a worker took but never started (it died in between) goes back to
  the queue once the message has been held for two leases, not at the broker's visibility
  timeout.
* A rollout waiting for a worker whose message vanished (kombu took it from the queue and
  lost it before recording it as taken: a crash, a broken connection, a Redis restart at
  that moment) gets a new one. One worker at a time checks, every four leases; a rollout is
  resent only when two checks in a row miss its message (a message moving between the queue
  and the taken set can hide from one check), and a needless resend is harmless: the claim
  turns the extra message away.
* A v2 rollout nobody polled in time is finished as ``lease_expired`` and its execution
  stopped.

The scripts re-check everything atomically, so concurrent sweepers never act twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rollout_worker import metrics
from rollout_worker.records import RecordStore
from rollout_worker.settings import FleetSettings

logger = logging.getLogger(__name__)

SWEEP_BATCH = 500


class Sweeper:
    def __init__(
        self, store: RecordStore, requeue_message: Callable[[str], str], settings: FleetSettings
    ) -> None:
        self._store = store
        self._requeue_message = requeue_message
        self._inflight_ttl_ms = int(settings.inflight_ttl_seconds * 1000)
        self._retention_ms = int(settings.result_retention_seconds * 1000)
        self._lease_seconds = settings.lease_seconds
        self._unstarted_after = 2 * settings.lease_seconds
        self._lost_check_ms = int(4 * settings.lease_seconds * 1000)

    async def sweep(self) -> int:
        """Requeue rollouts whose worker lease lapsed, whose taker never started them or
        whose message was lost; expire unpolled v2 rollouts."""
        requeued = await self._requeue_lapsed()
        taken_before = time.time() - self._unstarted_after
        for tag, record in await self._store.stale_deliveries(taken_before, SWEEP_BATCH):
            if await self._store.restore_unstarted(record, tag, self._requeue_message(record)):
                requeued += 1
                metrics.REQUEUES.labels("unstarted").inc()
                logger.warning(
                    "rollout %s: taken by a worker that never started it; requeued",
                    self._store.keys.rollout_key(record),
                )
        requeued += await self._resend_lost()
        expired = await self._store.expire_polls(SWEEP_BATCH, self._retention_ms)
        metrics.POLL_LEASE_EXPIRIES.inc(expired)
        if expired:
            logger.warning("%d rollouts were not polled in time: failed as lease_expired", expired)
        await self._store.prune(self._inflight_ttl_ms)
        return requeued

    async def _requeue_lapsed(self) -> int:
        lapsed = await self._store.expired(SWEEP_BATCH)
        if lapsed and await self._store.redis_uptime() < self._lease_seconds:
            return 0  # Redis just restarted: owners first get a lease to renew (see module)
        requeued = 0
        for record in lapsed:
            if await self._store.requeue(record, self._requeue_message(record)):
                requeued += 1
                metrics.REQUEUES.labels("lease_lapsed").inc()
                logger.warning(
                    "rollout %s: its worker stopped renewing the lease; requeued",
                    self._store.keys.rollout_key(record),
                )
        return requeued

    async def _resend_lost(self) -> int:
        if not await self._store.take_turn("lost-messages", self._lost_check_ms):
            return 0
        found = await self._store.waiting_without_message()
        previous = await self._store.swap_lost_suspects(found, 3 * self._lost_check_ms)
        resent = 0
        for record in sorted(found & previous):
            if await self._store.resend(record, self._requeue_message(record), self._lost_check_ms):
                resent += 1
                metrics.REQUEUES.labels("lost_message").inc()
                logger.warning(
                    "rollout %s: its message was lost on the way to a worker; resent",
                    self._store.keys.rollout_key(record),
                )
        return resent


__all__ = ["Sweeper"]
