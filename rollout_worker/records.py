"""Rollout records in Redis: key layout and the atomic state changes (Lua, ``lua/``).

One hash per rollout holds everything: status, the request (its API key sealed), the 202
body, timestamps, attempt, lease owner and result. Three sorted sets index them:

* ``leases``   record → lease expiry (ms); a lapsed entry means its worker died;
* ``active``   record → admission time, for rollouts not finished yet;
* ``finished`` record → retention expiry, for finished rollouts still kept.

Every key has a TTL. Statuses only move forward::

    admitting → queued → running (→ grading) (→ delivering) → success | failure | cancelled
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, cast

from redis.asyncio import Redis
from redis.commands.core import AsyncScript


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

    RUNNING = "running"  # run the agent
    DELIVERING = "delivering"  # a result is stored; deliver it
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
        return self.verdict in (Verdict.RUNNING, Verdict.DELIVERING, Verdict.EXHAUSTED)


@dataclass(frozen=True)
class Keys:
    prefix: str

    def record(self, protocol: str, rollout_key: str) -> str:
        return f"{self.prefix}:{protocol}:{rollout_key}"

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
    def fleet_key(self) -> str:
        return f"{self.prefix}:fleet-key"

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    def rollout_key(self, record: str) -> str:
        """The id part of a record key (``<prefix>:<protocol>:<id>`` → ``<id>``)."""
        return record.removeprefix(f"{self.prefix}:").split(":", 1)[-1]


def _load_scripts(redis: Redis) -> dict[str, AsyncScript]:
    folder = resources.files("rollout_worker") / "lua"
    prelude = (folder / "_prelude.lua").read_text()
    return {
        path.name.removesuffix(".lua"): redis.register_script(prelude + path.read_text())
        for path in folder.iterdir()
        if path.name.endswith(".lua") and not path.name.startswith("_")
    }


def _flatten(fields: Mapping[str, Any]) -> list[Any]:
    return [item for pair in fields.items() for item in pair]


class RecordStore:
    """Typed access to the records; every mutation is one Lua call (one round trip)."""

    def __init__(self, redis: Redis, prefix: str, queue: str) -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self.queue = queue
        self._scripts = _load_scripts(redis)

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts[script](keys=keys, args=args)

    # --- admission (gateway) ------------------------------------------------------------

    async def admit_begin(
        self, record: str, token: str, pending_ttl_ms: int
    ) -> tuple[str, str | None]:
        reply = await self._run("admit_begin", [record], [token, pending_ttl_ms])
        return reply[0], (reply[1] if len(reply) > 1 else None)

    async def admit_commit(
        self, record: str, token: str, ttl_ms: int, message: str, fields: Mapping[str, Any]
    ) -> bool:
        keys = [record, self.keys.active, self.queue]
        return bool(
            await self._run("admit_commit", keys, [token, ttl_ms, message, *_flatten(fields)])
        )

    async def admit_abort(self, record: str, token: str) -> None:
        await self._run("admit_abort", [record], [token])

    # --- execution (workers) ------------------------------------------------------------

    async def claim(self, record: str, owner: str, lease_ms: int, max_attempts: int) -> Claim:
        reply = await self._run(
            "claim", [record, self.keys.leases], [owner, lease_ms, max_attempts]
        )
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
        lost = await self._run(
            "renew", [self.keys.leases, *records], [owner, lease_ms, inflight_ttl_ms]
        )
        return list(lost)

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
        keys = [record, self.keys.leases, self.keys.active, self.keys.finished]
        args = [owner, status.value, result, ttl_ms, *_flatten(fields or {})]
        return bool(await self._run("finish", keys, args))

    async def load(self, record: str) -> dict[str, str]:
        return cast(dict[str, str], await self.redis.hgetall(record))

    # --- recovery (sweeper) -------------------------------------------------------------

    async def expired(self, limit: int) -> list[str]:
        return list(await self._run("expired", [self.keys.leases], [limit]))

    async def requeue(self, record: str, message: str) -> bool:
        return bool(await self._run("requeue", [record, self.keys.leases, self.queue], [message]))

    async def prune(self, inflight_ttl_ms: int) -> None:
        """Drop index entries whose records can no longer exist (their TTL ran out)."""
        now_ms = int(time.time() * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(self.keys.finished, "-inf", now_ms)
            pipe.zremrangebyscore(self.keys.active, "-inf", now_ms - inflight_ttl_ms)
            await pipe.execute()

    # --- fleet-wide counts (health) -----------------------------------------------------

    async def counts(self) -> tuple[int, int]:
        """(admitted and not finished, finished and still retained)."""
        now_ms = int(time.time() * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.active)
            pipe.zcount(self.keys.finished, now_ms, "+inf")
            active, finished = await pipe.execute()
        return int(active), int(finished)


__all__ = ["TERMINAL", "Claim", "Keys", "RecordStore", "Status", "Verdict"]
