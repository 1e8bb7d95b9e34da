"""What an operator asks of the fleet's records: the fleet at a glance (``rollout-fleet
status``), one rollout's state (``GET /v1/rollouts/{id}``, ``rollout-fleet status <id>``),
lists filtered by status and age (``rollout-fleet ls``), and the trajectories of finished
rollouts (``rollout-fleet export``, the workers' trajectory sink).

Reads only: records are changed by the store's scripts, never here.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from rollout_core.store import PROTOCOLS, Protocol, RecordStore, RolloutRecord


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


def _when(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, UTC) if ms is not None else None


def _span(start: int | None, end: int | None) -> float | None:
    return (end - start) / 1000 if start is not None and end is not None else None


def _outcome(record: RolloutRecord) -> dict[str, Any]:
    """Reward and error of a stored result (v1 completion body, or v2 wire result)."""
    if not record.result:
        return {}
    body = json.loads(record.result)
    if record.protocol == "v1":
        return {"reward": body.get("reward"), "error": body.get("error_message")}
    sample = body.get("sample") or {}
    return {
        "reward": sample.get("reward"),
        "error": body.get("err_message"),
        "error_category": body.get("err_category"),
    }


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def view_of(record: RolloutRecord, now_ms: int | None = None) -> RolloutView:
    """A record (with or without its result) as a :class:`RolloutView`."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    accepted = record.accepted_at
    return RolloutView(
        rollout_id=record.rollout_id,
        protocol=record.protocol,
        status=record.status or "unknown",
        attempt=record.attempt,
        worker=record.worker,
        accepted_at=_when(accepted),
        started_at=_when(record.started_at),
        claimed_at=_when(record.claimed_at),
        finished_at=_when(record.finished_at),
        queue_wait_seconds=_span(accepted, record.started_at),
        run_seconds=_span(record.claimed_at, record.finished_at),
        age_seconds=(now_ms - accepted) / 1000 if accepted is not None else 0.0,
        cancel_requested=record.cancel_requested,
        delivery=record.delivery,
        **_outcome(record),
    )


class FleetView(BaseModel):
    """The fleet now: live workers and what they run, and the rollouts Redis holds."""

    workers: int
    slots: int = Field(description="rollouts the live workers run at once")
    running: int = Field(description="rollouts a worker holds")
    waiting: int = Field(description="admitted rollouts no worker holds yet")
    finished: int = Field(description="finished rollouts still retained")
    sandbox_slots: int = Field(description="sandboxes the workers run at once (0: none runs any)")
    sandboxes: int = Field(description="sandboxes running, as the workers last reported")


async def fleet(store: RecordStore) -> FleetView:
    workers = await store.live_workers()
    counts = await store.counts()
    return FleetView(
        workers=workers.count,
        slots=workers.slots,
        running=counts.running,
        waiting=max(counts.active - counts.running, 0),
        finished=counts.finished,
        sandbox_slots=workers.sandbox_slots,
        sandboxes=workers.sandboxes,
    )


async def find(
    store: RecordStore, record_id: str, protocol: Protocol | None = None
) -> RolloutView | None:
    """A rollout by its id (v1: or its idempotency key), in either protocol unless one is
    given."""
    record = await store.find(record_id, (protocol,) if protocol else PROTOCOLS)
    return view_of(record, _ms(await store.clock())) if record is not None else None


async def listing(
    store: RecordStore,
    *,
    statuses: set[str] | None = None,
    older_than: float | None = None,
    newer_than: float | None = None,
    limit: int = 100,
) -> list[RolloutView]:
    """Rollouts the fleet holds (unfinished, and finished within retention), newest first,
    filtered by status and by age since admission (seconds)."""
    now_ms = _ms(await store.clock())  # Redis's clock, the one the records' times are in
    views = []
    for record in await store.summaries():
        view = view_of(record, now_ms)
        if statuses and view.status not in statuses:
            continue
        if older_than is not None and view.age_seconds < older_than:
            continue
        if newer_than is not None and view.age_seconds > newer_than:
            continue
        views.append(view)
    views.sort(key=lambda view: view.age_seconds)
    return views[:limit]


def trajectory_of(record: RolloutRecord) -> dict[str, Any]:
    """A finished rollout's export line (one JSON object; docs/OPERATIONS.md lists the fields):
    its view (status, attempts, worker, timings, reward, error), the request's label and
    metadata, the conversation with its tool calls, usage, and, when kept, the full
    ``trajectory_messages`` (v2) and each LLM turn's token ids and logprobs (v1)."""
    view = view_of(record)
    request = json.loads(record.request) if record.request else {}
    result = json.loads(record.result) if record.result else {}
    if view.protocol == "v1":
        metadata = request.get("metadata") or {}
        label = metadata.get("ground_truth")
        messages = result.get("final_messages") or []
        usage = result.get("metrics") or {}
        finish_reason = result.get("finish_reason")
    else:
        metadata = request.get("metadata")
        label = request.get("label")
        sample = result.get("sample") or {}
        messages = sample.get("messages") or []
        usage = sample.get("metrics") or {}
        finish_reason = None
    return {
        **view.model_dump(mode="json"),
        "label": label,
        "metadata": metadata,
        "messages": messages,
        "trajectory_messages": json.loads(record.trajectory) if record.trajectory else None,
        "finish_reason": finish_reason,
        "usage": usage,
        "turns": json.loads(record.turns) if record.turns else [],
    }


async def trajectories(store: RecordStore) -> AsyncIterator[dict[str, Any]]:
    """The export line of every finished rollout the fleet still keeps, oldest first."""
    async for record in store.finished_records():
        yield trajectory_of(record)


__all__ = [
    "FleetView",
    "RolloutView",
    "find",
    "fleet",
    "listing",
    "trajectories",
    "trajectory_of",
    "view_of",
]
