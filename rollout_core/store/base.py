"""What every role of the store shares (gateway, worker and CLI alike): one fleet's key names
and queue, its clients and scripts, and the few reads each role builds on (a record, Redis's
clock). The roles (``admission``, ``execution``, ``recovery``, ``fleet``, ``views``) extend
:class:`StoreBase`; :class:`~rollout_core.store.store.RecordStore` is all of them at once.

Durations are seconds in this API and milliseconds in Redis; :func:`ms` is the one place that
converts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Self, cast

from rollout_core.settings import FleetSettings
from rollout_core.store import replies
from rollout_core.store.connection import (
    AsyncScript,
    Pipeline,
    StoreClient,
    client,
    load_scripts,
    pipelined,
    reads_script_flags,
    run,
)
from rollout_core.store.errors import NotReplicated
from rollout_core.store.record import RolloutRecord
from rollout_core.store.replies import Reply
from rollout_core.store.schema import Keys, RecordField, RecordKey
from rollout_core.store.scripts import Script

type Arg = str | int  # a script's argument (a RecordField is a str)


def ms(seconds: float) -> int:
    return int(seconds * 1000)


def record_of(fields: Sequence[RecordField], values: Sequence[str | None]) -> RolloutRecord:
    """A record from an ``HMGET`` of ``fields`` (a field it lacks reads as None)."""
    return RolloutRecord.parse(
        {name: value for name, value in zip(fields, values, strict=True) if value is not None}
    )


def flatten(fields: Mapping[RecordField, str]) -> list[str]:
    """Record fields as a script's arguments: name, value, name, value…"""
    return [item for pair in fields.items() for item in pair]


class StoreBase:
    """Typed access to one fleet's records, queue and fleet-wide state in Redis."""

    def __init__(
        self,
        redis: StoreClient,
        prefix: str,
        queue: str,
        listener: StoreClient | None = None,
        admission_replicas: int = 0,
        replica_timeout_seconds: float = 1.0,
    ) -> None:
        self._redis = redis
        self._listener = listener or redis  # pub/sub: no command timeout
        self.keys = Keys(prefix)
        self.queue = queue
        # Registered at the first script run, once the server's version is known.
        self._loaded: dict[Script, AsyncScript] | None = None
        self._replicas = admission_replicas
        self._replica_timeout = replica_timeout_seconds

    @classmethod
    def connect(
        cls, settings: FleetSettings, max_connections: int | None = None, *, fail_fast: bool = False
    ) -> Self:
        """The store of the fleet ``settings`` describe, with its own connection pool. One
        that should ``fail_fast`` (a command line's) raises the first connection failure
        instead of retrying through it."""
        pool_size = max_connections or settings.redis_max_connections
        dsn, master = settings.redis_dsn, settings.sentinel_master
        listener = client(dsn, 4, master, listening=True, fail_fast=fail_fast)
        store = client(dsn, pool_size, master, fail_fast=fail_fast)
        return cls(
            store,
            settings.key_prefix,
            settings.queue,
            listener,
            settings.admission_replicas,
            settings.admission_replica_timeout_seconds,
        )

    async def aclose(self) -> None:
        await self._redis.aclose()
        if self._listener is not self._redis:
            await self._listener.aclose()

    async def _run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """Run ``script``; its reply, for the script's function in ``replies`` to read."""
        reply: Reply = await run((await self._scripts())[script], keys, args)
        return reply

    async def _scripts(self) -> dict[Script, AsyncScript]:
        """The fleet's scripts as this Redis runs them (its version is asked once)."""
        if self._loaded is None:
            flags = await reads_script_flags(self._redis)
            self._loaded = load_scripts(self._redis, self.keys, flags)
        return self._loaded

    async def _pipelined(self, fill: Callable[[Pipeline], Awaitable[None]]) -> list[Reply]:
        """The commands ``fill`` queues, in one round trip; their replies, to parse."""
        return await pipelined(self._redis, fill)

    async def _queue(
        self, pipe: Pipeline, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> None:
        """Queue a run of ``script`` in ``pipe`` (its reply comes with the pipeline's)."""
        await (await self._scripts())[script](keys=list(keys), args=list(args), client=pipe)

    async def _replicated(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """An admission script, then (when configured) ``WAIT`` on the same connection until
        ``admission_replicas`` replicas hold its writes: a rollout acknowledged to its trainer
        survives a failover to a replica."""
        if not self._replicas:
            return await self._run(script, keys, args)

        async def fill(pipe: Pipeline) -> None:
            await self._queue(pipe, script, keys, args)
            pipe.execute_command("WAIT", self._replicas, ms(self._replica_timeout))

        reply, acknowledged = await self._pipelined(fill)
        if replies.count(acknowledged) < self._replicas:
            raise NotReplicated(
                f"{acknowledged} of {self._replicas} replicas acknowledged the write "
                f"within {self._replica_timeout:g}s (ROLLOUT_FLEET_ADMISSION_REPLICAS)"
            )
        return reply

    async def ping(self) -> None:
        await self._redis.ping()

    async def load(self, key: RecordKey, *fields: RecordField) -> RolloutRecord:
        """A record (only ``fields`` of it, if given); an empty one if there is none."""
        if not fields:
            return RolloutRecord.parse(cast(dict[str, str], await self._redis.hgetall(key)))
        return record_of(fields, cast(list[str | None], await self._redis.hmget(key, list(fields))))

    async def clock(self) -> float:
        """Redis's time, in seconds: the one clock every host of the fleet agrees on (the
        scripts use it too), so skew between hosts cannot make workers vanish or linger."""
        seconds, micros = await self._redis.time()
        return seconds + micros / 1_000_000


__all__ = ["StoreBase", "flatten", "ms", "record_of"]
