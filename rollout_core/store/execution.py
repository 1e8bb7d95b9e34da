"""Execution: what workers call while they run rollouts (and only workers): take a message,
claim its rollout under a lease, renew the leases, move a rollout on, hand it back; announce
the worker's heartbeat and hear which executions must stop.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import cast

from rollout_core.store import replies
from rollout_core.store.base import Arg, StoreBase, flatten, ms
from rollout_core.store.connection import subscribed
from rollout_core.store.replies import Claim, Renewal, WorkerBeat
from rollout_core.store.schema import Advance, RecordField, RecordKey, Status
from rollout_core.store.scripts import Script


class Execution(StoreBase):
    """A worker's side of a rollout it runs, and of the worker itself."""

    @contextlib.asynccontextmanager
    async def stop_requests(self) -> AsyncIterator[AsyncIterator[RecordKey]]:
        """Subscribed to ``keys.stops`` while inside: the records whose execution must stop,
        as requests come."""
        async with subscribed(self._listener, self.keys.stops) as published:
            yield (RecordKey(data) async for data in published)

    async def execution_of(self, key: RecordKey) -> str:
        """The execution holding ``key``'s worker lease; "" when none does (finished, waiting
        for a worker, gone)."""
        return cast(str | None, await self._redis.hget(key, RecordField.EXECUTION)) or ""

    async def claim(
        self,
        key: RecordKey,
        execution: str,
        worker: str,
        lease_seconds: float,
        max_attempts: int,
        task_id: str = "",
        *,
        alone: bool = False,
    ) -> Claim:
        """Take the rollout under a lease held by ``execution`` (one run of it) of ``worker``,
        its message that of Celery task ``task_id``; ``alone``: the worker runs nothing else
        beside it (a crash of this execution counts against its attempts)."""
        args: list[Arg] = [
            execution,
            worker,
            ms(lease_seconds),
            max_attempts,
            task_id,
            "1" if alone else "",
        ]
        return replies.claim(await self._run(Script.CLAIM, [key], args))

    async def mark_alone(self, key: RecordKey, execution: str) -> bool:
        """``execution`` runs the rollout with no other rollout on its worker from now on, so
        a crash of it counts against the rollout's attempts; False if its lease is lost."""
        return replies.flag(await self._run(Script.ALONE, [key], [execution]))

    async def renew(
        self, leases: Mapping[str, RecordKey], lease_seconds: float, inflight_ttl_seconds: float
    ) -> Renewal:
        """Extend each ``execution → record`` lease still held; returns the executions that
        lost theirs, and the ones whose rollout's cancellation was requested."""
        if not leases:
            return Renewal([], [])
        args: list[Arg] = [ms(lease_seconds), ms(inflight_ttl_seconds), *leases]
        return replies.renew(await self._run(Script.RENEW, list(leases.values()), args))

    async def advance(
        self,
        key: RecordKey,
        execution: str,
        status: Status,
        *,
        result: str = "",
        retention_seconds: float = 0,
        cancelled_result: str = "",
        fields: Mapping[RecordField, str] | None = None,
    ) -> Advance:
        """Move the rollout to ``status`` (a terminal one keeps the record ``retention_seconds``).
        If its cancellation was requested, a success (or a result about to be delivered) is
        replaced by ``cancelled_result`` when one is given."""
        args: list[Arg] = [
            execution,
            status.value,
            result,
            ms(retention_seconds),
            cancelled_result,
            *flatten(fields or {}),
        ]
        return replies.advance(await self._run(Script.ADVANCE, [key], args))

    async def hand_back(
        self,
        key: RecordKey,
        execution: str,
        message: str,
        abandon: str = "",
        *,
        unposted: bool = False,
    ) -> bool:
        """Hand a rollout this worker runs back to the queue now; ``execution=""``: one it took
        but never started. ``abandon``: the reason to fail it with instead of running it again.
        ``unposted``: a rollout delivering its result may go back too, none of its callbacks
        having gone out (the caller barred them)."""
        args = [execution, message, abandon, "1" if unposted else ""]
        return replies.flag(await self._run(Script.HAND_BACK, [key, self.queue], args))

    async def beat(self, beat: WorkerBeat, ttl_seconds: int) -> None:
        """Announce a live worker for ``ttl_seconds`` (a silent worker drops out by itself).
        ``beat.at`` is Redis's time (:meth:`clock`), read once by the caller."""
        now = beat.at
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.worker(beat.worker), beat.model_dump_json(), ex=ttl_seconds)
            pipe.zadd(self.keys.workers, {beat.worker: now + ttl_seconds})
            pipe.zremrangebyscore(self.keys.workers, "-inf", now)
            pipe.expire(self.keys.workers, ttl_seconds)
            await pipe.execute()

    async def forget_worker(self, worker: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(worker))
            pipe.zrem(self.keys.workers, worker)
            await pipe.execute()

    async def take(self, wait_seconds: float) -> str | None:
        """Take the oldest message off the queue (the end admissions do not push to), waiting
        up to ``wait_seconds`` for one; ``None`` if none came."""
        reply = await self._redis.brpop([self.queue], timeout=wait_seconds)
        return None if reply is None else str(reply[1])

    async def put_back(self, raw: str) -> None:
        """Put a message taken off the queue back at the end it is taken from, as it was."""
        await self._redis.rpush(self.queue, raw)

    async def take_turn(self, chore: str, ttl_seconds: float) -> bool:
        """True for one caller per ``ttl_seconds`` fleet-wide: chores one worker does for all."""
        return bool(await self._redis.set(self.keys.turn(chore), "1", nx=True, px=ms(ttl_seconds)))


__all__ = ["Execution"]
