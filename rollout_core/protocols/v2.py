"""The v2 protocol's record (PROTOCOL.md §2).

A v2 rollout is stored under its ``rollout_id``. Its result is the wire result the trainer's
long-poll returns, stored as the SDK's models serialize it (``wire_json``); the results the
fleet makes itself (cancelled, lease expired) are built by the same models.
"""

from __future__ import annotations

from typing import Final

from rollout_core.protocols import sealed
from rollout_core.secrets import SecretBox
from rollout_core.store import Protocol, RecordField, RolloutRecord
from rollout_sdk.types import RolloutInitRequest, cancelled_result, lease_expired_result

PROTOCOL: Final[Protocol] = "v2"
SECRET = "llm_api_key"  # the key for the trainer's chat completions endpoint


def admission_fields(request: RolloutInitRequest, box: SecretBox) -> dict[RecordField, str]:
    """The record fields of a newly admitted v2 rollout."""
    return sealed.admission_fields(PROTOCOL, request, request.rollout_id, SECRET, box)


def request_from_record(record: RolloutRecord, box: SecretBox) -> RolloutInitRequest:
    return sealed.request_of(RolloutInitRequest, record, SECRET, box)


def cancelled_json(rollout_id: str) -> str:
    return cancelled_result(rollout_id).wire_json()


def lease_expired_json(rollout_id: str) -> str:
    return lease_expired_result(rollout_id).wire_json()


__all__ = [
    "PROTOCOL",
    "admission_fields",
    "cancelled_json",
    "lease_expired_json",
    "request_from_record",
]
