"""Long-poll wake-ups: one Redis pub/sub subscription per gateway process.

The store's scripts publish a record key on ``<prefix>:changes`` whenever its status moves;
the listener wakes the long-polls watching that record. A poll registers its watch *before*
reading the record, so no change can slip between the read and the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator

from rollout_core.store import RecordKey, RecordStore

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 0.5


class ChangeListener:
    """Listens from construction (on the gateway's event loop) until :meth:`stop`."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self._watchers: defaultdict[RecordKey, set[asyncio.Event]] = defaultdict(set)
        self._task = asyncio.create_task(self._pump(), name="change-listener")

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    @contextlib.contextmanager
    def watch(self, key: RecordKey) -> Iterator[asyncio.Event]:
        """An event set on the next status change of the record ``key``."""
        event = asyncio.Event()
        self._watchers[key].add(event)
        try:
            yield event
        finally:
            watchers = self._watchers[key]
            watchers.discard(event)
            if not watchers:
                del self._watchers[key]

    def _wake_all(self) -> None:
        for events in self._watchers.values():
            for event in events:
                event.set()

    async def _pump(self) -> None:
        while True:
            try:
                async with self._store.subscribe(self._store.keys.changes) as changes:
                    self._wake_all()  # anything may have changed while we were not listening
                    async for key in changes:
                        for event in self._watchers.get(key, ()):
                            event.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("change listener lost Redis; reconnecting", exc_info=True)
                await asyncio.sleep(RECONNECT_SECONDS)


__all__ = ["ChangeListener"]
