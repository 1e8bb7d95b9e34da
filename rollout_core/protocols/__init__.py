"""Each protocol generation's mapping between its wire models (``rollout_sdk``) and a record:
the fields an admission writes, the request a worker reads back, the results the fleet makes
itself. The gateway writes records with these, the worker reads them, so both agree."""

from __future__ import annotations

from rollout_core.protocols import v2
from rollout_core.store import Keys, RecordKey


def cancelled_result(keys: Keys, key: RecordKey) -> str:
    """What a queued rollout finishes with at once when cancelled: v2's cancelled result, or
    ``""`` for v1 (its worker claims it as cancelled and tells the trainer by callback)."""
    if keys.protocol(key) == v2.PROTOCOL:
        return v2.cancelled_json(keys.record_id(key))
    return ""


__all__ = ["cancelled_result"]
