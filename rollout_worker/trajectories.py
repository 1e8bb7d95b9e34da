"""Trajectories of finished rollouts, for training-data pipelines and debugging: the export
line of a record (``rollout-fleet export`` reads them from Redis before records expire), and
a sink that appends each rollout's line to a directory as it finishes
(``ROLLOUT_FLEET_TRAJECTORY_DIR``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, cast

from rollout_worker.inspection import view_of
from rollout_worker.records import TERMINAL, RecordStore


def trajectory_of(fields: Mapping[str, str]) -> dict[str, Any]:
    """A finished rollout's export line (one JSON object; docs/OPERATIONS.md lists the fields):
    its view (status, attempts, worker, timings, reward, error), the request's label and
    metadata, the conversation with its tool calls, usage, and, when kept, the full
    ``trajectory_messages`` (v2) and each LLM turn's token ids and logprobs (v1)."""
    view = view_of(fields)
    request = json.loads(fields["request"]) if fields.get("request") else {}
    result = json.loads(fields["result"]) if fields.get("result") else {}
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
        "trajectory_messages": json.loads(fields["trajectory"])
        if fields.get("trajectory")
        else None,
        "finish_reason": finish_reason,
        "usage": usage,
        "turns": json.loads(fields["turns"]) if fields.get("turns") else [],
    }


async def finished_records(store: RecordStore, batch: int = 500) -> AsyncIterator[dict[str, str]]:
    """Every finished record the fleet still keeps, oldest first, ``batch`` at a time."""
    records = cast(list[str], await store.redis.zrange(store.keys.finished, 0, -1))
    for start in range(0, len(records), batch):
        async with store.redis.pipeline(transaction=False) as pipe:
            for record in records[start : start + batch]:
                pipe.hgetall(record)
            rows = cast(list[dict[str, str]], await pipe.execute())
        for fields in rows:
            if fields.get("status") in TERMINAL:
                yield fields


class TrajectorySink:
    """Appends each finished rollout's export line to ``<directory>/<name>.jsonl`` (one file
    per worker process, so processes never interleave their writes)."""

    def __init__(self, store: RecordStore, directory: Path, name: str) -> None:
        self._store = store
        self._path = directory / f"{name}.jsonl"
        self._lock = asyncio.Lock()
        self._made = False  # the directory, on the first write (off the event loop)

    async def write(self, record: str) -> None:
        fields = await self._store.load(record)
        if fields.get("status") not in TERMINAL:
            return  # expired already (retention 0), or not this execution's to report
        line = json.dumps(trajectory_of(fields), default=str) + "\n"
        async with self._lock:
            await asyncio.to_thread(self._append, line)

    def _append(self, line: str) -> None:
        if not self._made:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._made = True
        with self._path.open("a", encoding="utf-8") as sink:
            sink.write(line)


__all__ = ["TrajectorySink", "finished_records", "trajectory_of"]
