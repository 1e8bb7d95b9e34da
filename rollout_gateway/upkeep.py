"""What gateways keep up in Redis while they run, besides answering requests: the fleet's
shared settings (``rollout_core/durability.py``), and waiting rollouts.

Admitted rollouts wait in Redis under a safety TTL (``ROLLOUT_FLEET_INFLIGHT_TTL_SECONDS``)
that is renewed while they wait (``prune.lua``). Workers' sweepers renew it; so does every
gateway once per sweep interval (the script is safe from any number of callers): a fleet whose
workers are all down or refusing to start (a wrong key, a bad agent) for longer than the TTL
must not lose what it admitted meanwhile, with no result and no error anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib

from rollout_core.durability import Agreement, SettingsKeeper
from rollout_core.settings import FleetSettings
from rollout_core.store import RecordStore, StoreError


async def keep_waiting_rollouts(
    store: RecordStore, settings: FleetSettings, agreement: Agreement
) -> None:
    """Keep the shared settings alive and renew waiting rollouts' TTL, once per sweep
    interval until cancelled; Redis trouble skips a turn."""
    every = settings.sweep_interval_seconds
    keeper = SettingsKeeper(store, settings, agreement)
    while True:
        with contextlib.suppress(StoreError):
            await keeper.keep()
            await store.prune(settings.inflight_ttl_seconds)
        await asyncio.sleep(every)


__all__ = ["keep_waiting_rollouts"]
