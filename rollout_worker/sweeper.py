"""Periodic recovery, run by every worker process.

* A rollout whose worker lease lapsed (its worker died) goes back to the front of the queue;
  with the default 15 s lease and 5 s sweep it runs again elsewhere within about 20 s, long
  before the broker's visibility timeout would redeliver it.
* A v2 rollout nobody polled in time is finished as ``lease_expired`` and its execution
  stopped.

The scripts re-check everything atomically, so concurrent sweepers never act twice.
"""

from __future__ import annotations

import logging

from celery import Celery

from rollout_worker.envelope import task_message
from rollout_worker.records import RecordStore
from rollout_worker.settings import FleetSettings

logger = logging.getLogger(__name__)

SWEEP_BATCH = 500


class Sweeper:
    def __init__(self, store: RecordStore, app: Celery, settings: FleetSettings) -> None:
        self._store = store
        self._app = app
        self._inflight_ttl_ms = int(settings.inflight_ttl_seconds * 1000)
        self._retention_ms = int(settings.result_retention_seconds * 1000)

    async def sweep(self) -> int:
        """Requeue rollouts whose worker lease lapsed; expire unpolled v2 rollouts."""
        requeued = 0
        for record in await self._store.expired(SWEEP_BATCH):
            rollout_key = self._store.keys.rollout_key(record)
            message = task_message(self._app, record, rollout_key, self._store.queue)
            if await self._store.requeue(record, message):
                requeued += 1
                logger.warning(
                    "rollout %s: its worker stopped renewing the lease; requeued", rollout_key
                )
        expired = await self._store.expire_polls(SWEEP_BATCH, self._retention_ms)
        if expired:
            logger.warning("%d rollouts were not polled in time: failed as lease_expired", expired)
        await self._store.prune(self._inflight_ttl_ms)
        return requeued


__all__ = ["Sweeper"]
