"""Rollout records in Redis: key layout and the atomic state changes (Lua, ``lua/``).

One hash per rollout holds everything: status, the request (its API key sealed), the 202
body or lease digest, timestamps, attempt, lease owner and result. Sorted sets index them:

* ``leases``       record → worker lease expiry (ms); a lapsed entry means its worker died;
* ``active``       record → admission time, while unfinished;
* ``finished``     record → retention expiry, once finished;
* ``poll-leases``  v2 record → the trainer's polling deadline;
* ``v2-ids``       v2 rollout ids, for cancel by prefix;
* ``workers``      worker → heartbeat expiry (s); each worker's status is ``worker:<owner>``;
* ``turn:<chore>``  held by the one worker doing a fleet-wide chore this period;
* ``lost-suspects`` rollouts the last check found waiting without a message.

Status changes are published on ``<prefix>:changes`` (long-polls wake on them) and requests
to stop an execution on ``<prefix>:stops``. Every record (and worker heartbeat) has a TTL;
index entries go when their records do (``prune.lua``). Statuses only move forward::

    admitting → queued → running (→ grading) (→ delivering) → success | failure | cancelled
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollout_worker.envelope import (
    UNACKED_INDEX_KEY,
    UNACKED_KEY,
    record_of_delivery,
    record_of_message,
)

POOL_WAIT_SECONDS = 10.0
# A broken connection is retried for about 10 s (0.1 s doubling to 2 s): a restarting Redis
# or a cut connection costs a pause, not a failed rollout. Every script tolerates running
# twice when its first reply was lost (a repeat finds the change made and says so).
RECONNECT = Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=8)


def connect(url: str, max_connections: int) -> Redis:
    """A client that reconnects and retries through connection failures, and whose pool
    makes callers wait for a free connection instead of failing."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_SECONDS,
        decode_responses=True,
        retry=RECONNECT,
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    return Redis(connection_pool=pool)


class Status(StrEnum):
    ADMITTING = "admitting"
    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    DELIVERING = "delivering"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"


TERMINAL = frozenset({Status.SUCCESS, Status.FAILURE, Status.CANCELLED})
WAITING = frozenset({Status.QUEUED, Status.DELIVERING})  # when not leased: needs a worker


class Verdict(StrEnum):
    """What a worker's claim found."""

    RUNNING = "running"  # run it
    DELIVERING = "delivering"  # a result is stored; deliver it
    CANCELLED = "cancelled"  # cancellation was requested: record that, do not run
    EXHAUSTED = "exhausted"  # too many attempts: fail the rollout
    ABANDONED = "abandoned"  # a worker gave it up (``abandon_reason``): fail the rollout
    BUSY = "busy"  # another live worker holds it (a duplicate delivery)
    DONE = "done"  # already finished
    MISSING = "missing"  # no such record (expired)


@dataclass(frozen=True)
class Claim:
    verdict: Verdict
    attempt: int = 0
    ms_since_accepted: int = 0
    record: Mapping[str, str] = field(default_factory=dict)

    @property
    def acquired(self) -> bool:
        return self.verdict not in (Verdict.BUSY, Verdict.DONE, Verdict.MISSING)


@dataclass(frozen=True)
class Keys:
    prefix: str

    def record(self, protocol: str, rollout_key: str) -> str:
        return f"{self.prefix}:{protocol}:{rollout_key}"

    def rollout_key(self, record: str) -> str:
        """The id part of a record key (``<prefix>:<protocol>:<id>`` → ``<id>``)."""
        return record.removeprefix(f"{self.prefix}:").split(":", 1)[-1]

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"

    @property
    def active(self) -> str:
        return f"{self.prefix}:active"

    @property
    def finished(self) -> str:
        return f"{self.prefix}:finished"

    @property
    def poll_leases(self) -> str:
        return f"{self.prefix}:poll-leases"

    @property
    def v2_ids(self) -> str:
        return f"{self.prefix}:v2-ids"

    @property
    def draining(self) -> str:
        return f"{self.prefix}:draining"

    @property
    def changes(self) -> str:
        return f"{self.prefix}:changes"

    @property
    def stops(self) -> str:
        return f"{self.prefix}:stops"

    @property
    def fleet_key(self) -> str:
        return f"{self.prefix}:fleet-key"

    @property
    def deployment(self) -> str:
        return f"{self.prefix}:deployment"

    def turn(self, chore: str) -> str:
        return f"{self.prefix}:turn:{chore}"

    @property
    def lost_suspects(self) -> str:
        return f"{self.prefix}:lost-suspects"


def _load_scripts(redis: Redis, prefix: str) -> dict[str, AsyncScript]:
    folder = resources.files("rollout_worker") / "lua"
    prelude = (folder / "_prelude.lua").read_text().replace("{prefix}", prefix)
    return {
        path.name.removesuffix(".lua"): redis.register_script(prelude + path.read_text())
        for path in folder.iterdir()
        if path.name.endswith(".lua") and not path.name.startswith("_")
    }


def _flatten(fields: Mapping[str, Any]) -> list[Any]:
    return [item for pair in fields.items() for item in pair]


class RecordStore:
    """Typed access to the records; every state change is one Lua call (one round trip)."""

    def __init__(self, redis: Redis, prefix: str, queue: str) -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self.queue = queue
        self._scripts = _load_scripts(redis, prefix)

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts[script](keys=keys, args=args)

    # --- v1 admission (gateway) ---------------------------------------------------------

    async def admit_begin(
        self, record: str, token: str, pending_ttl_ms: int
    ) -> tuple[str, str | None]:
        reply = await self._run("admit_begin", [record], [token, pending_ttl_ms])
        return reply[0], (reply[1] if len(reply) > 1 else None)

    async def admit_commit(
        self, record: str, token: str, ttl_ms: int, message: str, fields: Mapping[str, Any]
    ) -> bool:
        args = [token, ttl_ms, message, *_flatten(fields)]
        return bool(await self._run("admit_commit", [record, self.queue], args))

    async def admit_abort(self, record: str, token: str) -> None:
        await self._run("admit_abort", [record], [token])

    # --- v2 admission, polling, cancelling (gateway) ------------------------------------

    async def admit_v2(
        self,
        record: str,
        rollout_id: str,
        *,
        max_queued: int,
        poll_lease_ms: int,
        ttl_ms: int,
        message: str,
        lease_digest: str,
        fields: Mapping[str, Any],
    ) -> str:
        """``'queued'``, or why not: ``'draining'``, ``'full'``, ``'duplicate'``."""
        args = [
            max_queued,
            poll_lease_ms,
            ttl_ms,
            rollout_id,
            message,
            lease_digest,
            *_flatten(fields),
        ]
        return cast(str, await self._run("admit_v2", [record, self.queue], args))

    async def poll(
        self, record: str, lease_digest: str, poll_lease_ms: int, ttl_ms: int
    ) -> tuple[str, str | None]:
        """``('unknown'|'forbidden', None)``, ``('final', result)`` or ``('status', status)``."""
        reply = await self._run("poll", [record], [lease_digest, poll_lease_ms, ttl_ms])
        return reply[0], (reply[1] if len(reply) > 1 else None)

    async def cancel(self, records: list[str], ttl_ms: int) -> list[str]:
        """One disposition per record, in order (pipelined)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for record in records:
                await self._scripts["cancel"](keys=[record], args=[ttl_ms], client=pipe)
            return cast(list[str], await pipe.execute())

    async def v2_ids(self, prefix: str = "") -> list[str]:
        """Rollout ids the fleet holds (admitted and not evicted), optionally by prefix."""
        low = f"[{prefix}" if prefix else "-"
        high = f"[{prefix}\xff" if prefix else "+"
        return cast(list[str], await self.redis.zrangebylex(self.keys.v2_ids, low, high))

    # --- execution (workers) ------------------------------------------------------------

    async def claim(
        self, record: str, owner: str, worker: str, lease_ms: int, max_attempts: int
    ) -> Claim:
        """Take ``record`` under the lease ``owner`` (one execution) for ``worker``."""
        reply = await self._run("claim", [record], [owner, worker, lease_ms, max_attempts])
        verdict = Verdict(reply[0])
        if len(reply) == 1:
            return Claim(verdict)
        fields = reply[3:]
        return Claim(
            verdict, int(reply[1]), int(reply[2]), dict(zip(fields[::2], fields[1::2], strict=True))
        )

    async def renew(
        self, leases: Mapping[str, str], lease_ms: int, inflight_ttl_ms: int
    ) -> list[str]:
        """Extend each ``owner → record`` lease still held; returns the owners that lost."""
        if not leases:
            return []
        args = [lease_ms, inflight_ttl_ms, *leases]
        return list(await self._run("renew", list(leases.values()), args))

    async def finish(
        self,
        record: str,
        owner: str,
        status: Status,
        *,
        result: str = "",
        ttl_ms: int = 0,
        fields: Mapping[str, Any] | None = None,
    ) -> bool:
        args = [owner, status.value, result, ttl_ms, *_flatten(fields or {})]
        return bool(await self._run("finish", [record], args))

    async def release(self, record: str, owner: str, message: str, abandon: str = "") -> bool:
        """Give a rollout this worker runs back to the queue now; ``owner=""``: one it took but
        never started. ``abandon``: the reason to fail it with instead of running it again."""
        args = [owner, message, abandon]
        return bool(await self._run("release", [record, self.queue], args))

    async def load(self, record: str) -> dict[str, str]:
        return cast(dict[str, str], await self.redis.hgetall(record))

    # --- recovery (sweeper) -------------------------------------------------------------

    async def expired(self, limit: int) -> list[str]:
        return list(await self._run("expired", [], [limit]))

    async def redis_uptime(self) -> float:
        """Seconds since Redis (re)started."""
        info = await self.redis.info("server")
        return float(info["uptime_in_seconds"])

    async def stale_deliveries(self, taken_before: float, limit: int) -> list[tuple[str, str]]:
        """(delivery tag, record) of rollout messages workers took before ``taken_before``
        (epoch seconds) and still hold unacknowledged."""
        tags = cast(
            list[str],
            await self.redis.zrangebyscore(
                UNACKED_INDEX_KEY, "-inf", taken_before, start=0, num=limit
            ),
        )
        entries = cast(list[str | None], await self.redis.hmget(UNACKED_KEY, tags) if tags else [])
        stale = []
        for tag, entry in zip(tags, entries, strict=True):
            record = record_of_delivery(entry) if entry else None
            if record is not None:
                stale.append((tag, record))
        return stale

    async def restore_unstarted(self, record: str, tag: str, message: str) -> bool:
        """Requeue a taken message whose rollout never started (its taker died)."""
        keys = [record, UNACKED_KEY, UNACKED_INDEX_KEY, self.queue]
        return bool(await self._run("restore", keys, [tag, message]))

    async def waiting_without_message(self, batch: int = 1000) -> set[str]:
        """Rollouts waiting for a worker whose message is neither in the queue nor among the
        messages workers took: lost on its way to a worker. A snapshot: a message moving
        between the two at the wrong moment makes a false suspect (see the sweeper)."""
        waiting = await self._unleased_active()
        if not waiting:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for record in waiting:
                pipe.hget(record, "status")
            statuses = await pipe.execute()
        waiting = [r for r, s in zip(waiting, statuses, strict=True) if s in WAITING]
        if not waiting:
            return set()
        present: set[str | None] = set()
        for start in itertools.count(0, batch):  # the queue first: messages move to unacked
            chunk = cast(list[str], await self.redis.lrange(self.queue, start, start + batch - 1))
            present.update(map(record_of_message, chunk))
            if len(chunk) < batch:
                break
        unacked = cast(list[str], await self.redis.hvals(UNACKED_KEY))
        present.update(map(record_of_delivery, unacked))
        return set(waiting) - present

    async def _unleased_active(self) -> list[str]:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrange(self.keys.active, 0, -1)
            pipe.zrange(self.keys.leases, 0, -1)
            active, leased = await pipe.execute()
        return sorted(set(active) - set(leased))

    async def resend(self, record: str, message: str, guard_ms: int) -> bool:
        """Give a waiting rollout whose message was lost a new one (once per ``guard_ms``)."""
        return bool(await self._run("resend", [record, self.queue], [message, guard_ms]))

    async def take_turn(self, chore: str, ttl_ms: int) -> bool:
        """True for one caller per ``ttl_ms`` fleet-wide: chores one worker does for all."""
        return bool(await self.redis.set(self.keys.turn(chore), "1", nx=True, px=ttl_ms))

    async def swap_lost_suspects(self, found: set[str], ttl_ms: int) -> set[str]:
        """Keep this check's suspects (for ``ttl_ms``); return the previous check's."""
        key = self.keys.lost_suspects
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.smembers(key)
            pipe.delete(key)
            if found:
                pipe.sadd(key, *found)
                pipe.pexpire(key, ttl_ms)
            previous = (await pipe.execute())[0]
        return cast(set[str], previous)

    async def requeue(self, record: str, message: str) -> bool:
        return bool(await self._run("requeue", [record, self.queue], [message]))

    async def expire_polls(self, limit: int, ttl_ms: int) -> int:
        return int(await self._run("expire_polls", [], [limit, ttl_ms]))

    async def prune(self, inflight_ttl_ms: int) -> None:
        await self._run("prune", [], [inflight_ttl_ms])

    # --- worker heartbeats --------------------------------------------------------------

    async def beat(self, owner: str, status: Mapping[str, Any], ttl_seconds: int) -> None:
        """Announce a live worker for ``ttl_seconds`` (a silent worker drops out by itself)."""
        now = time.time()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.worker(owner), json.dumps(status), ex=ttl_seconds)
            pipe.zadd(self.keys.workers, {owner: now + ttl_seconds})
            pipe.zremrangebyscore(self.keys.workers, "-inf", now)
            pipe.expire(self.keys.workers, ttl_seconds)
            await pipe.execute()

    async def forget_worker(self, owner: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(owner))
            pipe.zrem(self.keys.workers, owner)
            await pipe.execute()

    async def live_workers(self) -> list[dict[str, Any]]:
        """The latest status of every worker whose heartbeat has not lapsed."""
        owners = cast(
            list[str], await self.redis.zrangebyscore(self.keys.workers, time.time(), "+inf")
        )
        if not owners:
            return []
        beats = await self.redis.mget([self.keys.worker(owner) for owner in owners])
        return [json.loads(beat) for beat in beats if beat]

    # --- fleet-wide counts (health) -----------------------------------------------------

    async def counts(self) -> tuple[int, int]:
        """(admitted and not finished, finished and still retained)."""
        now_ms = int(time.time() * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.active)
            pipe.zcount(self.keys.finished, now_ms, "+inf")
            active, finished = await pipe.execute()
        return int(active), int(finished)


__all__ = ["TERMINAL", "Claim", "Keys", "RecordStore", "Status", "Verdict", "connect"]
