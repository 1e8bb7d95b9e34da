"""Recovering rollouts whose worker died: lapsed lease → back to the front of the queue.

Every worker process sweeps; the requeue script re-checks the lease atomically, so
concurrent sweepers never enqueue a rollout twice. With the default 15 s lease and 5 s
sweep, a killed worker's rollouts are running again elsewhere within about 20 s, long
before the broker's visibility timeout would redeliver them.
"""

from __future__ import annotations

import logging

from celery import Celery

from rollout_worker.envelope import task_message
from rollout_worker.records import RecordStore

logger = logging.getLogger(__name__)

SWEEP_BATCH = 500


class Sweeper:
    def __init__(self, store: RecordStore, app: Celery, inflight_ttl_seconds: float) -> None:
        self._store = store
        self._app = app
        self._inflight_ttl_ms = int(inflight_ttl_seconds * 1000)

    async def sweep(self) -> int:
        """Requeue every rollout whose lease lapsed; returns how many were requeued."""
        requeued = 0
        for record in await self._store.expired(SWEEP_BATCH):
            rollout_key = self._store.keys.rollout_key(record)
            message = task_message(self._app, record, rollout_key, self._store.queue)
            if await self._store.requeue(record, message):
                requeued += 1
                logger.warning(
                    "rollout %s: its worker stopped renewing the lease; requeued", rollout_key
                )
        await self._store.prune(self._inflight_ttl_ms)
        return requeued


__all__ = ["Sweeper"]
