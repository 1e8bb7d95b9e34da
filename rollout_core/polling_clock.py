"""The polling leases' clock (PROTOCOL.md §2.7): time the fleet's Redis could not answer does
not count against a trainer's polling lease.

While Redis is stopped, restarting, loading its AOF, failing over or cut off from the fleet,
every poll fails (503), so no trainer can renew its lease; yet Redis's clock runs on, and on
its return every lease it outlasted was overdue: the first poll or sweep ended each rollout
``lease_expired``. Every gateway and worker process runs :meth:`PollingClock.run`: it tells
Redis every ``POLLING_CLOCK_TICK_SECONDS`` that the fleet reaches it. The scripts that read or
set a polling deadline tick too, and the first of them to find no tick for longer than
``POLLING_CLOCK_GAP_SECONDS`` moves every deadline still running then on by the whole gap
(``polling_now`` in ``store/lua/_prelude.lua``). It is Redis that keeps the clock, so a gateway
or sweeper that never saw the outage itself finds it all the same, and a restart (the clock
persists with the deadlines) looks like a stall. So does a time every gateway and worker was
down while Redis ran: nobody could poll then either. A lease nobody renews still runs out:
the outage is added once, and the lease runs on from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from rollout_core.store import RecordStore, StoreError
from rollout_core.store.schema import POLLING_CLOCK_TICK_SECONDS

logger = logging.getLogger(__name__)


class PollingClock:
    """Ticks the fleet's polling clock for one process; tells of each outage it finds."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self._outages: int | None = None  # as of this process's last tick

    async def tick(self) -> None:
        outages, away = await self._store.tick()
        if self._outages is not None and outages > self._outages:
            logger.warning(
                "Redis did not answer the fleet for %.1fs (stopped, restarting or cut off): "
                "the polling leases running then were extended by that time",
                away,
            )
        self._outages = outages

    async def run(self) -> None:
        """Tick until cancelled. A tick that cannot reach Redis is no failure: the gap it
        leaves is what the clock measures."""
        while True:
            with contextlib.suppress(StoreError):
                await self.tick()
            await asyncio.sleep(POLLING_CLOCK_TICK_SECONDS)


__all__ = ["PollingClock"]
