"""Rollout records in Redis: key layout and the atomic state changes (Lua, ``lua/``).

One hash per rollout holds everything: status, the request (its API key sealed), the 202
body or lease digest, timestamps, attempt, lease owner and result. Sorted sets index them:

* ``leases``       record → worker lease expiry (ms); a lapsed entry means its worker died;
* ``active``       record → admission time, while unfinished;
* ``finished``     record → retention expiry, once finished;
* ``poll-leases``  v2 record → the trainer's polling deadline;
* ``v2-ids``       v2 rollout ids, for cancel by prefix;
* ``workers``      worker → heartbeat expiry (s); each worker's status is ``worker:<owner>``.

Status changes are published on ``<prefix>:changes`` (long-polls wake on them) and requests
to stop an execution on ``<prefix>:stops``. Every key has a TTL. Statuses only move forward::

    admitting → queued → running (→ grading) (→ delivering) → success | failure | cancelled
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.commands.core import AsyncScript

POOL_WAIT_SECONDS = 10.0


def connect(url: str, max_connections: int) -> Redis:
    """A client whose pool makes callers wait for a free connection instead of failing."""
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=POOL_WAIT_SECONDS, decode_responses=True
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


class Verdict(StrEnum):
    """What a worker's claim found."""

    RUNNING = "running"  # run it
    DELIVERING = "delivering"  # a result is stored; deliver it
    CANCELLED = "cancelled"  # cancellation was requested: record that, do not run
    EXHAUSTED = "exhausted"  # too many attempts: fail the rollout
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
        fields: Mapping[str, Any],
    ) -> str:
        """``'queued'``, or why not: ``'draining'``, ``'full'``, ``'duplicate'``."""
        args = [max_queued, poll_lease_ms, ttl_ms, rollout_id, message, *_flatten(fields)]
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

    async def claim(self, record: str, owner: str, lease_ms: int, max_attempts: int) -> Claim:
        reply = await self._run("claim", [record], [owner, lease_ms, max_attempts])
        verdict = Verdict(reply[0])
        if len(reply) == 1:
            return Claim(verdict)
        fields = reply[3:]
        return Claim(
            verdict, int(reply[1]), int(reply[2]), dict(zip(fields[::2], fields[1::2], strict=True))
        )

    async def renew(
        self, owner: str, records: list[str], lease_ms: int, inflight_ttl_ms: int
    ) -> list[str]:
        if not records:
            return []
        return list(await self._run("renew", records, [owner, lease_ms, inflight_ttl_ms]))

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

    async def load(self, record: str) -> dict[str, str]:
        return cast(dict[str, str], await self.redis.hgetall(record))

    # --- recovery (sweeper) -------------------------------------------------------------

    async def expired(self, limit: int) -> list[str]:
        return list(await self._run("expired", [], [limit]))

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
