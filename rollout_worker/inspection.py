"""What an operator asks of the fleet's records: one rollout's state (``GET /v1/rollouts/{id}``,
``rollout-fleet status``) and lists filtered by status and age (``rollout-fleet ls``).

Reads only: records are changed by their scripts (records.py), never here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, cast

from pydantic import BaseModel, Field

from rollout_worker.records import RecordStore

Protocol = Literal["v1", "v2"]
PROTOCOLS: tuple[Protocol, ...] = ("v1", "v2")
SCAN_LIMIT = 20_000  # a listing reads at most this many unfinished and finished records
# Fields a listing reads: everything but the request and the (possibly large) result.
SUMMARY_FIELDS = (
    "protocol",
    "rollout_id",
    "status",
    "attempt",
    "worker",
    "accepted_at",
    "started_at",
    "claimed_at",
    "finished_at",
    "cancel_requested",
    "delivery",
)


class RolloutView(BaseModel):
    """One rollout as its record holds it (times in UTC; durations in seconds)."""

    rollout_id: str
    protocol: Protocol
    status: str
    attempt: int = Field(0, description="Executions started (1 unless a worker died)")
    worker: str | None = Field(None, description="The worker process that ran it last")
    accepted_at: datetime | None = None
    started_at: datetime | None = Field(None, description="First claim by a worker")
    claimed_at: datetime | None = Field(None, description="Latest claim by a worker")
    finished_at: datetime | None = None
    queue_wait_seconds: float | None = Field(None, description="Admission to first claim")
    run_seconds: float | None = Field(None, description="Latest claim to the terminal status")
    age_seconds: float = Field(0.0, description="Since admission")
    cancel_requested: bool = False
    delivery: str | None = Field(None, description="v1: how the completion callback went")
    reward: float | None = None
    error: str | None = None
    error_category: str | None = None


def _ms(fields: Mapping[str, str], name: str) -> int | None:
    value = fields.get(name)
    return int(value) if value else None


def _when(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, UTC) if ms is not None else None


def _span(start: int | None, end: int | None) -> float | None:
    return (end - start) / 1000 if start is not None and end is not None else None


def _outcome(protocol: str, result: str | None) -> dict[str, Any]:
    """Reward and error of a stored result (v1 completion body, or v2 wire result)."""
    if not result:
        return {}
    body = json.loads(result)
    if protocol == "v1":
        return {"reward": body.get("reward"), "error": body.get("error_message")}
    sample = body.get("sample") or {}
    return {
        "reward": sample.get("reward"),
        "error": body.get("err_message"),
        "error_category": body.get("err_category"),
    }


def view_of(fields: Mapping[str, str], now_ms: int | None = None) -> RolloutView:
    """A record's fields (with or without ``result``) as a :class:`RolloutView`."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    accepted, started = _ms(fields, "accepted_at"), _ms(fields, "started_at")
    claimed, finished = _ms(fields, "claimed_at"), _ms(fields, "finished_at")
    protocol = cast(Protocol, fields.get("protocol", "v1"))
    return RolloutView(
        rollout_id=fields.get("rollout_id", ""),
        protocol=protocol,
        status=fields.get("status", "unknown"),
        attempt=int(fields.get("attempt") or 0),
        worker=fields.get("worker"),
        accepted_at=_when(accepted),
        started_at=_when(started),
        claimed_at=_when(claimed),
        finished_at=_when(finished),
        queue_wait_seconds=_span(accepted, started),
        run_seconds=_span(claimed, finished),
        age_seconds=(now_ms - accepted) / 1000 if accepted is not None else 0.0,
        cancel_requested=bool(fields.get("cancel_requested")),
        delivery=fields.get("delivery"),
        **_outcome(protocol, fields.get("result")),
    )


async def find(
    store: RecordStore, rollout_key: str, protocol: Protocol | None = None
) -> RolloutView | None:
    """A rollout by its id (v1: its idempotency key), in either protocol unless one is given."""
    for candidate in (protocol,) if protocol else PROTOCOLS:
        fields = cast(
            dict[str, str], await store.redis.hgetall(store.keys.record(candidate, rollout_key))
        )
        if fields.get("status") not in (None, "admitting"):
            return view_of(fields)
    return None


async def listing(
    store: RecordStore,
    *,
    statuses: set[str] | None = None,
    older_than: float | None = None,
    newer_than: float | None = None,
    limit: int = 100,
) -> list[RolloutView]:
    """Rollouts the fleet holds (unfinished, and finished within retention), newest first,
    filtered by status and by age since admission (seconds). Looks at the newest
    ``SCAN_LIMIT`` of each kind."""
    redis, keys = store.redis, store.keys
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrevrange(keys.active, 0, SCAN_LIMIT - 1)
        pipe.zrevrange(keys.finished, 0, SCAN_LIMIT - 1)
        active, finished = await pipe.execute()
    records = list(dict.fromkeys([*active, *finished]))
    async with redis.pipeline(transaction=False) as pipe:
        for record in records:
            pipe.hmget(record, SUMMARY_FIELDS)
        rows = await pipe.execute()
    now_ms = int(time.time() * 1000)
    views = []
    for values in rows:
        fields = {name: value for name, value in zip(SUMMARY_FIELDS, values, strict=True) if value}
        if fields.get("status") in (None, "admitting"):
            continue  # expired between the two reads, or not admitted yet
        view = view_of(fields, now_ms)
        if statuses and view.status not in statuses:
            continue
        if older_than is not None and view.age_seconds < older_than:
            continue
        if newer_than is not None and view.age_seconds > newer_than:
            continue
        views.append(view)
    views.sort(key=lambda view: view.age_seconds)
    return views[:limit]


__all__ = [
    "PROTOCOLS",
    "RolloutView",
    "find",
    "listing",
    "view_of",
]
