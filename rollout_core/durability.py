"""Refusing a Redis that can lose admitted rollouts.

Two settings of Redis lose work the fleet has acknowledged, silently: an eviction policy other
than ``noeviction`` (the records carry TTLs, so under memory pressure Redis drops them while
their queue messages survive: the claim finds nothing and the trainer never hears back), and
no persistence at all (a restart forgets everything). Every gateway and worker checks at start
and refuses to run on either, unless the operator says, by a setting nobody sets by accident,
that losing rollouts is acceptable.
"""

from __future__ import annotations

import logging

from rollout_core.settings import FleetSettings
from rollout_core.store import RecordStore, StoreUnavailable

logger = logging.getLogger(__name__)

OVERRIDE = "ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS"


class RedisLosesData(RuntimeError):
    """Redis is configured to drop admitted rollouts; the message names each risk and its fix."""


async def refuse_data_loss(store: RecordStore, settings: FleetSettings) -> None:
    """Raise :class:`RedisLosesData` if Redis can lose admitted rollouts (a loud warning
    instead with the override). A Redis that does not answer yet is checked by the next
    process to start: refusing to start would not make it answer."""
    try:
        risks = await store.data_loss_risks()
    except StoreUnavailable as exc:
        logger.warning("Redis did not answer the durability check at start: %r", exc)
        return
    if not risks:
        return
    report = "; ".join(risks)
    if settings.allow_redis_data_loss:
        logger.warning("Redis can lose admitted rollouts (%s=true): %s", OVERRIDE, report)
        return
    raise RedisLosesData(
        f"refusing to run: Redis can lose admitted rollouts: {report}. To run anyway, "
        f"accepting the loss, set {OVERRIDE}=true."
    )


__all__ = ["OVERRIDE", "RedisLosesData", "refuse_data_loss"]
