"""Long-poll wake-ups: one Redis pub/sub subscription per gateway process.

Workers and scripts publish a record key on ``<prefix>:changes`` whenever its status moves;
the listener wakes the long-polls watching that record. A poll registers its watch *before*
reading the record, so no change can slip between the read and the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator

from redis.asyncio import Redis

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 0.5


class ChangeListener:
    def __init__(self, redis: Redis, channel: str) -> None:
        self._redis = redis
        self._channel = channel
        self._watchers: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._pump())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.contextmanager
    def watch(self, record: str) -> Iterator[asyncio.Event]:
        """An event set on the next status change of ``record``."""
        event = asyncio.Event()
        self._watchers[record].add(event)
        try:
            yield event
        finally:
            watchers = self._watchers[record]
            watchers.discard(event)
            if not watchers:
                del self._watchers[record]

    def _wake_all(self) -> None:
        for events in self._watchers.values():
            for event in events:
                event.set()

    async def _pump(self) -> None:
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(self._channel)
                    self._wake_all()  # anything may have changed while we were not listening
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            for event in self._watchers.get(message["data"], ()):
                                event.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("change listener lost Redis; reconnecting", exc_info=True)
                await asyncio.sleep(RECONNECT_SECONDS)


__all__ = ["ChangeListener"]
