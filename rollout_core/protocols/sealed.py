"""The one way a request travels in a record: as JSON without its API key, the key sealed
beside it (``secrets.py``), and put back together when a worker reads it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from rollout_core import tracing
from rollout_core.secrets import SecretBox, SecretUnreadable
from rollout_core.store import Protocol, RecordField, RolloutRecord


class UnreadableRecord(ValueError):
    """A record no worker of this fleet can run: its request does not parse (a rolling
    upgrade changed the shape) or its API key does not open. Retrying cannot help: the rollout
    fails with this message."""


def admission_fields(
    protocol: Protocol, request: BaseModel, rollout_id: str, secret_field: str, box: SecretBox
) -> dict[RecordField, str]:
    """The record fields of a newly admitted rollout; its API key is sealed, never plain."""
    fields = {
        RecordField.PROTOCOL: protocol,
        RecordField.ROLLOUT_ID: rollout_id,
        RecordField.REQUEST: request.model_dump_json(exclude={secret_field}),
        **tracing.context_fields(),
    }
    secret = getattr(request, secret_field)
    if secret:
        fields[RecordField.SECRET] = box.seal(secret)
    return fields


def request_of[Request: BaseModel](
    model: type[Request],
    record: RolloutRecord,
    secret_field: str,
    box: SecretBox,
    context: dict[str, Any] | None = None,
) -> Request:
    """The admitted request a record holds, its API key unsealed."""
    if record.request is None:
        raise UnreadableRecord("the rollout's record holds no request")
    try:
        request = model.model_validate_json(record.request, context=context)
    except ValidationError as exc:
        raise UnreadableRecord(
            f"the stored request no longer parses as a {model.__name__} "
            f"({exc.error_count()} errors; first: {exc.errors()[0]['msg']})"
        ) from None
    if record.secret is not None:
        try:
            secret = box.open(record.secret)
        except SecretUnreadable as exc:
            raise UnreadableRecord(str(exc)) from None
        request = request.model_copy(update={secret_field: secret})
    return request


def secret_of(record: RolloutRecord, box: SecretBox) -> str | None:
    """The API key a record carries, unsealed; ``None`` if it has none or it does not open."""
    if record.secret is None:
        return None
    try:
        return box.open(record.secret)
    except SecretUnreadable:
        return None


__all__ = ["UnreadableRecord", "admission_fields", "request_of", "secret_of"]
