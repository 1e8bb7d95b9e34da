"""Fleet-wide state, which gateways, workers and the CLI all read or keep: counts, live
workers, the queue's owner, the deployment's id and sealing key, Redis's own health, the
polling clock, cancellations and the stream of status changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast

from rollout_core.queue.envelope import read_queued
from rollout_core.store import replies
from rollout_core.store.base import StoreBase, ms
from rollout_core.store.connection import Pipeline, subscribed
from rollout_core.store.errors import StoreReplyError
from rollout_core.store.replies import (
    ClockTicks,
    FleetCounts,
    FleetFigures,
    FleetWorkers,
    WorkerBeat,
)
from rollout_core.store.schema import CancelOutcome, Change, MemoryField, RecordField, RecordKey
from rollout_core.store.scripts import Script


@dataclass(frozen=True)
class MemoryFigures:
    """What Redis holds against what it may (``INFO memory``), with the fleet's own figures
    of what its unfinished rollouts will add: read in one round trip."""

    used_bytes: int  # used_memory
    max_bytes: int  # maxmemory; 0: no limit
    unfinished: int  # rollouts admitted and not finished (the active index)
    finish_bytes: float | None  # the running mean a finish added; None before any finish


class FleetState(StoreBase):
    """What the whole fleet shares, beyond any one rollout."""

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[Change]]:
        """Subscribed to ``keys.changes`` while inside: each status change, as it comes."""
        async with subscribed(self._listener, self.keys.changes) as published:
            yield (Change.read(data) async for data in published)

    async def cancel(
        self, cancelled_results: Mapping[RecordKey, str], retention_seconds: float
    ) -> dict[RecordKey, CancelOutcome]:
        """Cancel each rollout (pipelined). Its value is the result a queued rollout finishes
        with at once (v2), or ``""``: the worker that claims it reports the cancellation."""

        async def fill(pipe: Pipeline) -> None:
            for key, result in cancelled_results.items():
                await self._queue(pipe, Script.CANCEL, [key], [ms(retention_seconds), result])

        outcomes = await self._pipelined(fill)
        return {
            key: replies.cancel(outcome)
            for key, outcome in zip(cancelled_results, outcomes, strict=True)
        }

    async def memory_figures(self) -> MemoryFigures:
        """Redis's memory and the fleet's figures for the headroom admissions keep."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.info("memory")
            pipe.zcard(self.keys.active)
            pipe.hget(self.keys.memory, MemoryField.FINISH_BYTES)
            memory, unfinished, finish = await pipe.execute()
        return MemoryFigures(
            used_bytes=int(memory["used_memory"]),
            max_bytes=int(memory.get("maxmemory", 0)),
            unfinished=int(unfinished),
            finish_bytes=None if finish is None else float(finish),
        )

    async def counts(self) -> FleetCounts:
        now_ms = ms(await self.clock())
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.active)
            pipe.zcard(self.keys.leases)
            pipe.zcount(self.keys.finished, now_ms, "+inf")
            active, running, finished = await pipe.execute()
        return FleetCounts(int(active), int(running), int(finished))

    async def deployment_id(self, new_id: str) -> str:
        """The deployment's id: ``new_id`` if none is kept yet (Redis lost the fleet's state,
        or this is the first ask), else the kept one."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.deployment, new_id, nx=True)
            pipe.get(self.keys.deployment)
            _, deployment = await pipe.execute()
        return cast(str, deployment)

    async def fleet_figures(self) -> FleetFigures:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.llen(self.queue)
            pipe.lindex(self.queue, -1)  # kombu takes messages from this end: the oldest
            depth, oldest = await pipe.execute()
        age = 0.0
        message = read_queued(oldest) if oldest else None
        if message is not None:
            record = RecordKey(message.record)
            accepted = (await self.load(record, RecordField.ACCEPTED_AT)).accepted_at
            if accepted is not None:
                age = max(0.0, await self.clock() - accepted / 1000)
        return FleetFigures(
            queue_depth=int(depth),
            oldest_queued_seconds=round(age, 3),
            counts=await self.counts(),
            workers=await self.live_workers(),
        )

    async def data_loss_risks(self) -> list[str]:
        """What in Redis's configuration can lose admitted rollouts, each with its fix (empty:
        nothing). ``CONFIG`` may be renamed away on a managed Redis: ``INFO`` is read first."""
        memory = await self._redis.info("memory")
        persistence = await self._redis.info("persistence")
        risks = []
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction":
            risks.append(
                f"maxmemory-policy is {policy}, so under memory pressure Redis evicts records "
                "whose messages stay queued (set maxmemory-policy noeviction: the fleet then "
                "refuses admissions when full instead of losing them)"
            )
        if not int(persistence.get("aof_enabled", 0)):
            try:
                save = str((await self._redis.config_get("save")).get("save", ""))
            except StoreReplyError:  # CONFIG is not allowed here: snapshots cannot be told
                save = "unknown"
            if not save.strip():
                risks.append(
                    "persistence is off (appendonly no, no save points), so a restart loses "
                    "every admitted rollout (set appendonly yes)"
                )
        return risks

    async def connected_replicas(self) -> int:
        """How many replicas are connected to the primary (``INFO replication``)."""
        replication = await self._redis.info("replication")
        return int(replication.get("connected_slaves", 0))

    async def server_run(self) -> str:
        """The Redis server's run id: a new one after every restart."""
        server = await self._redis.info("server")
        return str(server.get("run_id", ""))

    async def generated_secret_key(self) -> str | None:
        """The sealing key the fleet generated for itself, if it ever ran without one."""
        return cast(str | None, await self._redis.get(self.keys.fleet_key))

    async def fleet_secret_key(self, generated: str) -> str:
        """The fleet's own sealing key: ``generated`` if none is kept yet, else the kept one."""
        await self._redis.set(self.keys.fleet_key, generated, nx=True)
        stored = await self.generated_secret_key()
        if stored is None:
            raise RuntimeError(f"the fleet key {self.keys.fleet_key} vanished from Redis")
        return stored

    async def read_key_canary(self) -> str | None:
        """The sealed key canary (``Keys.key_canary``), if any process wrote one."""
        return cast(str | None, await self._redis.get(self.keys.key_canary))

    async def write_key_canary(self, sealed: str, *, replace: bool) -> None:
        """Store the sealed key canary; unless ``replace``, only if none is stored."""
        await self._redis.set(self.keys.key_canary, sealed, nx=not replace)

    async def live_workers(self) -> FleetWorkers:
        """The latest beat of every worker whose heartbeat has not lapsed."""
        now = await self.clock()
        names = cast(list[str], await self._redis.zrangebyscore(self.keys.workers, now, "+inf"))
        if not names:
            return FleetWorkers()
        beats = await self._redis.mget([self.keys.worker(name) for name in names])
        return FleetWorkers([WorkerBeat.model_validate_json(beat) for beat in beats if beat])

    @property
    def queue_owner_key(self) -> str:
        """The key naming the key prefix of the fleet that uses this queue (beside the queue,
        outside any fleet's prefix: fleets with different prefixes must all see it)."""
        return f"_rollout_fleet.queue_owner.{self.queue}"

    async def own_queue(self) -> tuple[str, str]:
        """Register this fleet's key prefix as the queue's user, and the queue as the
        prefix's, unless registered already; what is registered: (the queue's prefix, the
        prefix's queue), ours or another fleet's."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self.queue_owner_key, self.keys.prefix, nx=True)
            pipe.set(self.keys.fleet_queue, self.queue, nx=True)
            pipe.get(self.queue_owner_key)
            pipe.get(self.keys.fleet_queue)
            _, _, owner, queue = await pipe.execute()
        return cast(str | None, owner) or self.keys.prefix, cast(str | None, queue) or self.queue

    async def prune(self, inflight_ttl_seconds: float, batch: int = 1000) -> None:
        """Drop the index entries of records whose TTL ran out; renew the TTL of up to
        ``batch`` rollouts that have waited half of it (a backlog must not expire). Workers
        and gateways both do it (with no worker running, gateways keep what waits alive)."""
        await self._run(Script.PRUNE, [], [ms(inflight_ttl_seconds), batch])

    async def share_settings(self, key: str, settings: str, ttl_seconds: float) -> str:
        """Store ``settings`` under ``key`` as the fleet's shared ones unless some are stored
        already; what is stored. Either way they are kept ``ttl_seconds`` more."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(key, settings, nx=True, px=ms(ttl_seconds))
            pipe.get(key)
            pipe.pexpire(key, ms(ttl_seconds))
            _, stored, _ = await pipe.execute()
        return cast(str | None, stored) or settings

    async def registered_queues(self) -> dict[str, str]:
        """Every fleet's queue on this Redis database → its key prefix (the registrations
        :meth:`own_queue` writes)."""
        head = self.queue_owner_key.removesuffix(self.queue)
        keys = [key async for key in self._redis.scan_iter(match=f"{head}*", count=1000)]
        if not keys:
            return {}
        prefixes = cast(list[str | None], await self._redis.mget(keys))
        return {
            key.removeprefix(head): prefix
            for key, prefix in zip(keys, prefixes, strict=True)
            if prefix is not None
        }

    async def queue_owner(self) -> str | None:
        """The key prefix registered as the queue's user, if any."""
        return cast(str | None, await self._redis.get(self.queue_owner_key))

    async def holds_fleet(self) -> bool:
        """Whether a fleet with this key prefix uses this Redis database: its queue is
        registered to the prefix, or some of the prefix's fleet-wide keys exist."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self.queue_owner_key)
            pipe.exists(
                self.keys.active,
                self.keys.finished,
                self.keys.workers,
                self.keys.deployment,
                self.keys.fleet_key,
                self.keys.v2_ids,
            )
            owner, existing = await pipe.execute()
        return owner == self.keys.prefix or int(existing) > 0

    async def tick(self) -> ClockTicks:
        """This process reached Redis: the polling leases' clock ticks (``tick.lua``). How
        many outages the clock has found, and the last one's length in seconds."""
        return replies.tick(await self._run(Script.TICK, [], []))


__all__ = ["FleetState", "MemoryFigures"]
