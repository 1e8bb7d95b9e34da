"""Appending each finished rollout's trajectory to a directory as it finishes
(``ROLLOUT_FLEET_TRAJECTORY_DIR``), for training-data pipelines and debugging. A line is the
one ``rollout-fleet export`` writes (``rollout_core.views.trajectory_of``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rollout_core.store import RecordKey, RecordStore
from rollout_core.views import trajectory_of


class TrajectorySink:
    """Appends each finished rollout's export line to ``<directory>/<name>.jsonl`` (one file
    per worker process, so processes never interleave their writes)."""

    def __init__(self, store: RecordStore, directory: Path, name: str) -> None:
        self._store = store
        self._path = directory / f"{name}.jsonl"
        self._lock = asyncio.Lock()
        self._made = False  # the directory, on the first write (off the event loop)

    async def write(self, key: RecordKey) -> None:
        record = await self._store.load(key)
        if not record.finished:
            return  # expired already (retention 0), or not this execution's to report
        line = json.dumps(trajectory_of(record), default=str) + "\n"
        async with self._lock:
            await asyncio.to_thread(self._append, line)

    def _append(self, line: str) -> None:
        if not self._made:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._made = True
        with self._path.open("a", encoding="utf-8") as sink:
            sink.write(line)


__all__ = ["TrajectorySink"]
