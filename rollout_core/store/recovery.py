"""Recovery: what the workers' sweeper calls (and only workers): leases that lapsed, messages
lost between the queue and a worker, v2 rollouts nobody polled in time, index entries of
expired records. Every repair is a script that checks before it changes anything, so two
sweepers, or one run twice, repair once.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import cast

from rollout_core.queue.envelope import QueuedMessage, read_queued, record_of_message
from rollout_core.store import replies
from rollout_core.store.base import Arg, StoreBase, ms
from rollout_core.store.connection import BudgetedRetry, Pipeline
from rollout_core.store.schema import (
    UNACKED,
    UNACKED_INDEX,
    WAITING,
    RecordField,
    RecordKey,
    Status,
)
from rollout_core.store.scripts import Script


class Recovery(StoreBase):
    """The sweeper's repairs, each safe to repeat."""

    # --- recovery (sweeper) -------------------------------------------------------------

    async def lapsed_leases(self, limit: int) -> list[RecordKey]:
        return replies.record_keys(await self._run(Script.LAPSED, [], [limit]))

    @staticmethod
    def seconds_since_trouble() -> float:
        """Seconds since this process last failed to reach Redis (a cut connection, a Redis
        stopped, restarting, loading its AOF or failing over). A Redis at ``maxmemory`` is
        none: renewals still go through there."""
        return time.monotonic() - BudgetedRetry.last_failure

    async def redis_uptime(self) -> float:
        """Seconds since Redis (re)started."""
        info = await self._redis.info("server")
        return float(info["uptime_in_seconds"])

    async def requeue(self, key: RecordKey, message: str, max_attempts: int) -> bool:
        """Put a rollout whose lease lapsed back on the queue (``message``); a crash of its
        run counts against ``max_attempts`` as the claim's takeover does."""
        args: list[Arg] = [message, max_attempts]
        return replies.flag(await self._run(Script.REQUEUE, [key, self.queue], args))

    async def stale_taken_messages(
        self, taken_before: float, page: int
    ) -> list[tuple[str, RecordKey]]:
        """(delivery tag, record) of this fleet's rollout messages workers took before
        ``taken_before`` (epoch seconds) and still hold unacknowledged, whose rollout never
        started. All of them, read ``page`` at a time: with late acks the oldest entries are
        simply long-running rollouts, and a lost message may hide behind any number of them."""
        stale = []
        for start in itertools.count(0, page):
            tags = cast(
                list[str],
                await self._redis.zrangebyscore(
                    UNACKED_INDEX, "-inf", taken_before, start=start, num=page
                ),
            )
            if not tags:
                break
            entries = cast(list[str | None], await self._redis.hmget(UNACKED, tags))
            candidates = []
            for tag, entry in zip(tags, entries, strict=True):
                key = record_of_message(entry) if entry else None
                if key is not None and self.keys.owns(key):
                    candidates.append((tag, RecordKey(key)))
            async with self._redis.pipeline(transaction=False) as pipe:
                for _, key in candidates:
                    pipe.hget(key, RecordField.STATUS)
                statuses = await pipe.execute()
            stale += [c for c, s in zip(candidates, statuses, strict=True) if s == Status.QUEUED]
            if len(tags) < page:
                break
        return stale

    async def restore_unstarted(self, key: RecordKey, tag: str, message: str) -> bool:
        """Requeue a taken message whose rollout never started (its taker died)."""
        keys = [key, UNACKED, UNACKED_INDEX, self.queue]
        return replies.flag(await self._run(Script.RESTORE, keys, [tag, message]))

    async def waiting_without_message(self, limit: int = 2000) -> set[RecordKey]:
        """Rollouts waiting for a worker whose message is neither in the queue nor among the
        messages workers took: lost on its way to a worker (kombu takes a message from the
        queue's tail and records it as taken in two steps).

        The work follows the rollouts in flight, not the backlog. Admissions push their
        message to the back of the queue in admission order (the ``active`` index's order)
        and every other push of the fleet goes to the front, so the queue reads, from the
        tail: front pushes, then admission messages oldest first. Reading from the tail up
        to the first admission message F, every rollout admitted before F either has a
        message among those read or had its admission message taken by a worker; only
        those are looked up, however long the queue behind F. A front part longer than
        ``limit`` messages (a mass requeue being worked off) skips this check. A snapshot: a
        message moving at the wrong moment makes a false suspect (the sweeper resends only on
        two checks in a row).

        Round trips do not grow with the rollouts in flight either: one ``ZMSCORE`` tells
        which candidates hold a lease (nearly all: they run), and only the others' statuses
        are read."""
        scan = await self._read_queue_tail(limit)
        if scan is None:
            return set()
        seen, admitted_before = scan
        candidates = cast(
            list[str],
            await self._redis.zrangebyscore(self.keys.active, "-inf", f"({admitted_before}"),
        )
        candidates = [key for key in candidates if key not in seen]
        if not candidates:
            return set()
        leases = await self._redis.zmscore(self.keys.leases, candidates)
        unleased = [key for key, lease in zip(candidates, leases, strict=True) if lease is None]
        if not unleased:
            return set()
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in unleased:
                pipe.hget(key, RecordField.STATUS)
            statuses = await pipe.execute()
        waiting = [key for key, status in zip(unleased, statuses, strict=True) if status in WAITING]
        if not waiting:
            return set()
        taken = set(map(record_of_message, cast(list[str], await self._redis.hvals(UNACKED))))
        return {RecordKey(key) for key in waiting if key not in taken}

    async def _read_queue_tail(self, limit: int) -> tuple[set[str], int] | None:
        """The records of the messages at the queue's tail up to its oldest admission, and
        the time (ms) before which every rollout admitted is behind that part; ``None`` if
        the front part is longer than ``limit`` messages. Admissions share milliseconds, so
        the read goes on past the oldest admission's millisecond: every message of a rollout
        admitted within it has been read then. Reads double in size from a few messages: the
        front part is usually empty."""
        started = ms(await self.clock())
        seen: set[str] = set()
        oldest: int | None = None
        read, size = 0, 8
        while read < limit:
            size = min(size, limit - read)
            chunk = cast(list[str], await self._redis.lrange(self.queue, -read - size, -read - 1))
            for raw in reversed(chunk):  # from the tail
                message = read_queued(raw)
                if message is None or not self.keys.owns(message.record):
                    continue
                seen.add(message.record)
                if not message.admitted or not (at := await self._admission_time(message)):
                    continue
                if oldest is None:
                    oldest = at
                elif at > oldest:
                    return seen, oldest + 1
            if len(chunk) < size:
                return seen, started + 1  # read to the end: all of it was seen (an admission
                # in that last millisecond after the read is a suspect for one check only)
            read, size = read + size, size * 2
        return None

    async def _admission_time(self, message: QueuedMessage) -> int | None:
        """When the rollout of an admission message was admitted (ms), if the message is its
        current admission's (a record admitted again since keeps a new time)."""
        task, accepted = await self._redis.hmget(
            message.record, [RecordField.TASK, RecordField.ACCEPTED_AT]
        )
        return int(accepted) if task == message.task_id and accepted else None

    async def resend(self, key: RecordKey, message: str, guard_seconds: float) -> bool:
        """Give a waiting rollout whose message was lost a new one (once per guard period)."""
        args: list[Arg] = [message, ms(guard_seconds)]
        return replies.flag(await self._run(Script.RESEND, [key, self.queue], args))

    async def swap_lost_suspects(self, found: set[RecordKey], ttl_seconds: float) -> set[RecordKey]:
        """Keep this check's suspects (for ``ttl_seconds``); return the previous check's."""
        key = self.keys.lost_suspects
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.smembers(key)
            pipe.delete(key)
            if found:
                pipe.sadd(key, *found)
                pipe.pexpire(key, ms(ttl_seconds))
            previous = (await pipe.execute())[0]
        return {RecordKey(key) for key in previous}

    async def overdue_polling_leases(self, limit: int) -> list[RecordKey]:
        """v2 rollouts nobody polled in time."""
        return replies.record_keys(await self._run(Script.OVERDUE_POLLING_LEASES, [], [limit]))

    async def expire_polling_leases(
        self, lease_expired_results: Mapping[RecordKey, str], retention_seconds: float
    ) -> int:
        """Finish each overdue rollout with its lease-expired result (pipelined), unless a
        poll came since; how many were expired."""

        async def fill(pipe: Pipeline) -> None:
            for key, result in lease_expired_results.items():
                args: list[Arg] = [result, ms(retention_seconds)]
                await self._queue(pipe, Script.EXPIRE_POLLING_LEASE, [key], args)

        expired = await self._pipelined(fill)
        return sum(map(replies.flag, expired))


__all__ = ["Recovery"]
