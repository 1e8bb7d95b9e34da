"""Periodic recovery, run by every worker process.

* A rollout whose worker lease lapsed (its worker died) goes back to the front of the queue;
  with the default 15 s lease and 5 s sweep it runs again elsewhere within about 20 s, long
  before the broker's visibility timeout would redeliver it. Not within two leases after a
  Redis restart, after this worker itself could not reach Redis (a stopped or partitioned
  Redis, an AOF load, a failover), nor after this worker started (it may have started during
  or right after an outage it never saw): leases lapsed then because nobody could renew them,
  and their live holders get that long to renew before anyone takes over (a takeover of a
  rollout delivering its v1 callback would post that callback twice).
* A rollout waiting for a worker whose message vanished gets a new one. A worker's intake
  takes a message off the queue and claims its rollout in the next step
  (``rollout_worker/intake.py``), so this is how a rollout comes back whose worker died in
  between (or froze with the message in its socket), or whose message a broken connection
  or a Redis restart lost.
  One worker at a time checks, every two leases; a rollout is resent only when two checks in
  a row miss its message (a message on its way to a worker can hide from one check), and a
  needless resend is harmless: the claim turns the extra message away. With the default 15 s
  lease such a rollout runs again within about a minute.
* A message kombu's own ack emulation recorded as taken (``unacked``: a worker of another
  kind on the database) and never started goes back to the queue once it has been held for
  two leases, not at the broker's visibility timeout. One worker per sweep looks, through
  every taken message of this fleet (the taken set is shared by every fleet on the
  database: others' messages are left alone).
* A v2 rollout nobody polled in time is finished as ``lease_expired`` and its execution
  stopped.

The scripts re-check everything atomically, so concurrent sweepers never act twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rollout_core.protocols import v2
from rollout_core.settings import FleetSettings
from rollout_core.store import RecordKey, RecordStore
from rollout_worker import metrics

logger = logging.getLogger(__name__)

SWEEP_BATCH = 500
# Why a rollout went back on the queue: the requeues metric's label, and what the log says.
REQUEUED = {
    "lease_lapsed": "its worker stopped renewing the lease; requeued",
    "unstarted": "taken by a worker that never started it; requeued",
    "lost_message": "its message was lost on the way to a worker; resent",
}


class Sweeper:
    def __init__(
        self,
        store: RecordStore,
        requeue_message: Callable[[RecordKey], str],
        settings: FleetSettings,
        started: float | None = None,
    ) -> None:
        """``started``: when this worker started (monotonic; default now)."""
        self._store = store
        self._started = time.monotonic() if started is None else started
        self._requeue_message = requeue_message
        self._inflight_ttl = settings.inflight_ttl_seconds
        self._retention = settings.result_retention_seconds
        self._lease_seconds = settings.lease_seconds
        self._max_attempts = settings.max_attempts
        self._sweep_interval = settings.sweep_interval_seconds
        self._unstarted_after = 2 * settings.lease_seconds
        self._lost_check_every = 2 * settings.lease_seconds

    async def sweep(self) -> int:
        """Requeue rollouts whose worker lease lapsed, whose taker never started them or
        whose message was lost; expire unpolled v2 rollouts."""
        requeued = await self._requeue_lapsed()
        requeued += await self._restore_unstarted()
        requeued += await self._resend_lost()
        await self._expire_unpolled()
        await self._store.prune(self._inflight_ttl)
        return requeued

    async def _expire_unpolled(self) -> None:
        overdue = await self._store.overdue_polling_leases(SWEEP_BATCH)
        if not overdue:
            return
        results = {key: v2.lease_expired_json(self._store.keys.record_id(key)) for key in overdue}
        expired = await self._store.expire_polling_leases(results, self._retention)
        metrics.POLLING_LEASE_EXPIRIES.inc(expired)
        if expired:
            logger.warning("%d rollouts were not polled in time: failed as lease_expired", expired)

    async def _requeue_lapsed(self) -> int:
        lapsed = await self._store.lapsed_leases(SWEEP_BATCH)
        if lapsed and await self._redis_was_away():
            return 0  # holders first get a lease to renew (see module)
        requeued = 0
        for key in lapsed:
            if await self._store.requeue(key, self._requeue_message(key), self._max_attempts):
                requeued += self._requeued("lease_lapsed", key)
        return requeued

    async def _restore_unstarted(self) -> int:
        """One worker per sweep interval reads every taken message (not every worker the
        oldest 500, which late acks make long-running rollouts); kombu stamps the taken set
        with its host's clock, so this compares with the host's clock too."""
        if not await self._store.take_turn("unstarted", self._sweep_interval):
            return 0
        restored = 0
        taken_before = time.time() - self._unstarted_after
        for tag, key in await self._store.stale_taken_messages(taken_before, SWEEP_BATCH):
            if await self._store.restore_unstarted(key, tag, self._requeue_message(key)):
                restored += self._requeued("unstarted", key)
        return restored

    async def _redis_was_away(self) -> bool:
        """Whether Redis may have been out of reach lately, as far as this worker can know:
        within the last two leases it restarted (its uptime), this worker could not reach it
        (stopped, loading its AOF, failing over, cut off: its uptime says nothing then, every
        holder lost its lease the same way, and a holder may still be in its retry backoff
        when this sweeper gets through), or this worker started (it cannot tell an outage
        that ended just before it)."""
        hold_off = 2 * self._lease_seconds
        if time.monotonic() - self._started < hold_off:
            return True
        if self._store.seconds_since_trouble() < hold_off:
            return True
        return await self._store.redis_uptime() < hold_off

    async def _resend_lost(self) -> int:
        if not await self._store.take_turn("lost-messages", self._lost_check_every):
            return 0
        found = await self._store.waiting_without_message()
        previous = await self._store.swap_lost_suspects(found, 3 * self._lost_check_every)
        resent = 0
        for key in sorted(found & previous):
            if await self._store.resend(key, self._requeue_message(key), self._lost_check_every):
                resent += self._requeued("lost_message", key)
        return resent

    def _requeued(self, reason: str, key: RecordKey) -> int:
        """Count and log one rollout put back on the queue; 1."""
        metrics.REQUEUES.labels(reason).inc()
        logger.warning("rollout %s: %s", self._store.keys.record_id(key), REQUEUED[reason])
        return 1


__all__ = ["Sweeper"]
