"""Room to finish what was admitted: a gateway admits a rollout only while Redis has the
room every rollout admitted and not finished needs to end, and this one besides.

A rollout admitted is a promise of writes to come: its result, its lease renewals, the
sweeps that repair it. At ``maxmemory`` (``noeviction``) Redis refuses writes, and refusing
admissions only once it refuses them too leaves the rollouts already admitted without the room
to end. So admissions stop earlier, while Redis still has

    unfinished × finish bytes × ROLLOUT_FLEET_REDIS_FINISH_ROOM_FACTOR
    + maxmemory × ROLLOUT_FLEET_REDIS_RESERVE_FRACTION

free, from the fleet's own figures: ``used_memory`` and ``maxmemory`` (``INFO memory``), the
rollouts admitted and not finished (the active index), and the running mean of the bytes a
finishing rollout added (kept by the scripts that end rollouts, ``_prelude.lua``). A Redis
without ``maxmemory`` has no such limit here.

The figures are read once per :data:`REFRESH_SECONDS` per gateway process, not per admission;
between two reads the admissions this process made count against the room at the mean size
of its admissions so far, so a burst between reads cannot overrun it. A refused admission
is answered as a full store is (v1: 503, v2: 429, both with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from rollout_core.settings import FleetSettings
from rollout_core.store import MemoryFigures, NoHeadroom, RecordField, RecordStore, StoreError

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 0.5
# A finish's bytes before any rollout of this fleet finished (then the fleet's own mean).
FIRST_FINISH_BYTES = 4096.0
# An admission's bytes before this process made one: its record, message and index entries.
FIRST_ADMISSION_BYTES = 4096.0
# What an admission adds besides the bytes it writes: the record's key, its entries in the
# active index and the queue, the fields' own overhead.
ADMISSION_OVERHEAD_BYTES = 512
# Figures older than this are not trusted to admit on (Redis stopped answering the reads).
STALE_SECONDS = 10.0


class Headroom:
    """One gateway process's view of the room Redis has left for admitted work."""

    def __init__(self, store: RecordStore, settings: FleetSettings) -> None:
        self._store = store
        self._reserve = settings.redis_reserve_fraction
        self._factor = settings.redis_finish_room_factor
        self._figures: MemoryFigures | None = None
        self._read_at = -float("inf")  # monotonic
        # Admissions this process made since the figures were read (not in them yet).
        self._since_count = 0
        self._since_bytes = 0.0
        self._admission_bytes = FIRST_ADMISSION_BYTES  # this process's running mean
        self._refusing = False

    async def refresh(self) -> MemoryFigures:
        """Read the figures again; admissions made before the read are in them."""
        count, size = self._since_count, self._since_bytes
        figures = await self._store.memory_figures()
        self._figures, self._read_at = figures, time.monotonic()
        self._since_count = max(0, self._since_count - count)
        self._since_bytes = max(0.0, self._since_bytes - size)
        return figures

    async def run(self) -> None:
        """Refresh every :data:`REFRESH_SECONDS` until cancelled; Redis trouble skips a turn."""
        while True:
            with contextlib.suppress(StoreError):
                await self.refresh()
            await asyncio.sleep(REFRESH_SECONDS)

    def lacking(self) -> int:
        """Bytes Redis lacks for the unfinished rollouts and one admission more to end
        (0: there is room; also when Redis has no ``maxmemory``, or no figures were read yet:
        the admission's own call to Redis then says)."""
        figures = self._figures
        if figures is None or not figures.max_bytes:
            return 0
        finish = figures.finish_bytes if figures.finish_bytes is not None else FIRST_FINISH_BYTES
        unfinished = figures.unfinished + self._since_count + 1
        needed = (
            unfinished * finish * self._factor
            + figures.max_bytes * self._reserve
            + self._admission_bytes
        )
        free = figures.max_bytes - figures.used_bytes - self._since_bytes
        return max(0, int(needed - free))

    async def check(self) -> None:
        """Raise :class:`NoHeadroom` unless Redis has room for one admission more."""
        if time.monotonic() - self._read_at > STALE_SECONDS:
            with contextlib.suppress(StoreError):  # Redis away: the admission itself says
                await self.refresh()
        lacking = self.lacking()
        if lacking and not self._refusing:
            figures = self._figures
            assert figures is not None
            logger.warning(
                "admissions refused: Redis lacks %d bytes of the room the %d unfinished "
                "rollouts need to end (used_memory %d of maxmemory %d)",
                lacking,
                figures.unfinished + self._since_count,
                figures.used_bytes,
                figures.max_bytes,
            )
        elif not lacking and self._refusing:
            logger.warning("admissions resumed: Redis has room for the unfinished rollouts again")
        self._refusing = bool(lacking)
        if lacking:
            raise NoHeadroom(
                f"Redis lacks {lacking} bytes of the room admitted rollouts need to end"
            )

    def admitted(self, written_bytes: int) -> None:
        """This process admitted a rollout that wrote ``written_bytes`` (its fields and
        message): counted against the room until the next read."""
        size = written_bytes + ADMISSION_OVERHEAD_BYTES
        self._admission_bytes += (size - self._admission_bytes) / 32
        self._since_count += 1
        self._since_bytes += size


def written_bytes(message: str, fields: Mapping[RecordField, str]) -> int:
    """The bytes an admission writes: its message and its record's fields."""
    return len(message) + sum(len(name) + len(value) for name, value in fields.items())


__all__ = [
    "ADMISSION_OVERHEAD_BYTES",
    "FIRST_ADMISSION_BYTES",
    "FIRST_FINISH_BYTES",
    "REFRESH_SECONDS",
    "Headroom",
    "written_bytes",
]
