"""The v1 protocol's record (PROTOCOL.md §1).

A v1 rollout is stored under its idempotency key (``idempotency_key or rollout_id``, P§1.3.1).
The worker stores the completion body (status ``delivering``) before it posts it, so a worker
that dies mid-delivery leaves a result another worker delivers.
"""

from __future__ import annotations

from typing import Final

from rollout_core.protocols import sealed
from rollout_core.secrets import SecretBox
from rollout_core.store import Protocol, RecordField, RolloutRecord
from rollout_sdk.core.schemas import RolloutRequest

PROTOCOL: Final[Protocol] = "v1"
SECRET = "api_key"  # the trainer's key for its TrainGate


def admission_fields(
    request: RolloutRequest, response_json: str, box: SecretBox
) -> dict[RecordField, str]:
    """The record fields of a newly admitted v1 rollout, with the 202 body it replays."""
    fields = sealed.admission_fields(PROTOCOL, request, request.rollout_id, SECRET, box)
    return {**fields, RecordField.RESPONSE: response_json}


def request_from_record(record: RolloutRecord, box: SecretBox) -> RolloutRequest:
    # "admitted": the metadata size limit was checked at admission; it may have changed since.
    return sealed.request_of(RolloutRequest, record, SECRET, box, context={"admitted": True})


__all__ = ["PROTOCOL", "admission_fields", "request_from_record"]
