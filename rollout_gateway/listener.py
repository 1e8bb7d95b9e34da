"""Long-poll wake-ups: one Redis pub/sub subscription per gateway process.

The store's scripts publish a v2 record's new status on ``<prefix>:changes`` when it moves;
the listener wakes the long-polls watching that record and tells them the status, so a poll
woken by a change that is not final answers without reading the record again. A poll
registers its watch *before* reading the record, so no change can slip between the read and
the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator

from rollout_core.store import RecordKey, RecordStore, Status

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 0.5


class Watch:
    """One poll's watch on one record: set on its next status change."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        # The status the last change announced; None when the listener lost Redis meanwhile
        # (anything may have changed: read the record).
        self.status: Status | None = None

    def wake(self, status: Status | None) -> None:
        self.status = status
        self.changed.set()


class ChangeListener:
    """Listens from construction (on the gateway's event loop) until :meth:`stop`."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self._watchers: defaultdict[RecordKey, set[Watch]] = defaultdict(set)
        self._task = asyncio.create_task(self._pump(), name="change-listener")

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    @contextlib.contextmanager
    def watch(self, key: RecordKey) -> Iterator[Watch]:
        """A watch woken by the next status change of the record ``key``."""
        watch = Watch()
        self._watchers[key].add(watch)
        try:
            yield watch
        finally:
            watchers = self._watchers[key]
            watchers.discard(watch)
            if not watchers:
                del self._watchers[key]

    def _wake_all(self) -> None:
        for watches in self._watchers.values():
            for watch in watches:
                watch.wake(None)

    async def _pump(self) -> None:
        while True:
            try:
                async with self._store.changes() as changes:
                    self._wake_all()  # anything may have changed while we were not listening
                    async for change in changes:
                        for watch in self._watchers.get(change.key, ()):
                            watch.wake(change.status)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("change listener lost Redis; reconnecting", exc_info=True)
                await asyncio.sleep(RECONNECT_SECONDS)


__all__ = ["ChangeListener", "Watch"]
