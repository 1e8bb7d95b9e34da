"""Read-only views of the records, for the CLI (``status``, ``ls``, ``export``) and the
gateway's lookups: find a rollout by any id it answers to, list the newest, stream the
finished. Nothing here changes a record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import cast

from rollout_core.store.base import StoreBase
from rollout_core.store.record import RolloutRecord
from rollout_core.store.schema import PROTOCOLS, Protocol, RecordField, RecordKey

SCAN_LIMIT = 20_000  # a listing reads at most this many unfinished and finished records
# Fields a listing reads: everything but the request and the (possibly large) result.
SUMMARY_FIELDS = (
    RecordField.PROTOCOL,
    RecordField.ROLLOUT_ID,
    RecordField.STATUS,
    RecordField.ATTEMPT,
    RecordField.WORKER,
    RecordField.ACCEPTED_AT,
    RecordField.STARTED_AT,
    RecordField.CLAIMED_AT,
    RecordField.FINISHED_AT,
    RecordField.CANCEL_REQUESTED,
    RecordField.DELIVERY,
)


class RecordViews(StoreBase):
    """Reads of records by id, in summary, and finished."""

    # --- read-only views (status, ls, export) -------------------------------------------

    async def find(
        self, record_id: str, protocols: Iterable[Protocol] = PROTOCOLS
    ) -> RolloutRecord | None:
        """The admitted rollout stored under ``record_id``, in the first protocol that has one;
        a v1 rollout is found by its idempotency key and by its rollout id."""
        for key in await self.keys_of(record_id, protocols):
            record = await self.load(key)
            if record.admitted:
                return record
        return None

    async def keys_of(
        self, record_id: str, protocols: Iterable[Protocol] = PROTOCOLS
    ) -> list[RecordKey]:
        """The record keys an id may name: each protocol's record of that id and, in v1,
        the record of the rollout admitted with that rollout id under another idempotency
        key (its alias, see ``schema``)."""
        keys = []
        for protocol in protocols:
            keys.append(self.keys.record(protocol, record_id))
            if protocol == "v1":
                aliased = cast(str | None, await self._redis.get(self.keys.v1_alias(record_id)))
                if aliased is not None and aliased not in keys:
                    keys.append(RecordKey(aliased))
        return keys

    async def summaries(self) -> list[RolloutRecord]:
        """The newest ``SCAN_LIMIT`` unfinished and finished rollouts, without their request
        and result."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrevrange(self.keys.active, 0, SCAN_LIMIT - 1)
            pipe.zrevrange(self.keys.finished, 0, SCAN_LIMIT - 1)
            active, finished = await pipe.execute()
        keys = list(dict.fromkeys([*active, *finished]))
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, SUMMARY_FIELDS)
            rows = await pipe.execute()
        records = (
            RolloutRecord.parse(
                {name: value for name, value in zip(SUMMARY_FIELDS, row, strict=True) if value}
            )
            for row in rows
        )
        return [record for record in records if record.admitted]  # not expired meanwhile

    async def finished_records(self, batch: int = 500) -> AsyncIterator[RolloutRecord]:
        """Every finished record the fleet still keeps, oldest first, ``batch`` at a time."""
        keys = cast(list[str], await self._redis.zrange(self.keys.finished, 0, -1))
        for start in range(0, len(keys), batch):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys[start : start + batch]:
                    pipe.hgetall(key)
                rows = cast(list[dict[str, str]], await pipe.execute())
            for fields in rows:
                record = RolloutRecord.parse(fields)
                if record.finished:
                    yield record

    async def v2_ids(self, prefix: str = "") -> list[str]:
        """Rollout ids the fleet holds (admitted and not evicted), optionally by prefix."""
        if not prefix:
            return cast(list[str], await self._redis.zrangebylex(self.keys.v2_ids, "-", "+"))
        # Bytes: the byte 0xff follows every UTF-8 continuation of the prefix (as a str,
        # "\xff" would be encoded as c3 bf and miss ids going on with U+0100 and above).
        low, high = b"[" + prefix.encode(), b"[" + prefix.encode() + b"\xff"
        return cast(list[str], await self._redis.zrangebylex(self.keys.v2_ids, low, high))


__all__ = ["SCAN_LIMIT", "SUMMARY_FIELDS", "RecordViews"]
