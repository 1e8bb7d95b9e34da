"""One rollout's record, as typed values (Redis keeps every field as a string)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rollout_core.store.schema import TERMINAL, TRACE_FIELDS, Protocol, RecordField, Status


def _int(value: str | None) -> int | None:
    return int(value) if value else None


@dataclass(frozen=True)
class RolloutRecord:
    """The fields of a record hash that were read (a partial read leaves the others unset).

    Times are milliseconds since the epoch, by Redis's clock.
    """

    status: Status | None = None
    protocol: Protocol = "v1"
    rollout_id: str = ""
    request: str | None = None
    secret: str | None = None
    response: str | None = None
    result: str | None = None
    lease_digest: str | None = None
    attempt: int = 0
    forgiven: int = 0  # crashes not counted: its worker ran other rollouts too
    alone: str | None = None  # the execution that ran it alone on its worker, if any
    deliveries: int = 0  # v1: claims of its stored result, to deliver it
    accepted_at: int | None = None
    started_at: int | None = None
    claimed_at: int | None = None
    finished_at: int | None = None
    worker: str | None = None
    task: str | None = None
    cancel_requested: bool = False
    abandon_reason: str | None = None
    delivery: str | None = None
    turns: str | None = None
    trajectory: str | None = None
    admit_token: str | None = None  # v1: the admission that wrote the record
    trace: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> RolloutRecord:
        get = fields.get
        status = get(RecordField.STATUS)
        protocol = get(RecordField.PROTOCOL, "v1")
        return cls(
            status=Status(status) if status else None,
            protocol="v2" if protocol == "v2" else "v1",
            rollout_id=get(RecordField.ROLLOUT_ID, ""),
            request=get(RecordField.REQUEST),
            secret=get(RecordField.SECRET) or None,  # a finished record's is emptied
            response=get(RecordField.RESPONSE),
            result=get(RecordField.RESULT),
            lease_digest=get(RecordField.LEASE_DIGEST),
            attempt=int(get(RecordField.ATTEMPT) or 0),
            forgiven=int(get(RecordField.FORGIVEN) or 0),
            alone=get(RecordField.ALONE) or None,
            deliveries=int(get(RecordField.DELIVERIES) or 0),
            accepted_at=_int(get(RecordField.ACCEPTED_AT)),
            started_at=_int(get(RecordField.STARTED_AT)),
            claimed_at=_int(get(RecordField.CLAIMED_AT)),
            finished_at=_int(get(RecordField.FINISHED_AT)),
            worker=get(RecordField.WORKER),
            task=get(RecordField.TASK),
            cancel_requested=bool(get(RecordField.CANCEL_REQUESTED)),
            abandon_reason=get(RecordField.ABANDON_REASON),
            delivery=get(RecordField.DELIVERY),
            turns=get(RecordField.TURNS),
            trajectory=get(RecordField.TRAJECTORY),
            admit_token=get(RecordField.ADMIT_TOKEN) or None,
            trace={name.value: fields[name] for name in TRACE_FIELDS if name in fields},
        )

    @property
    def admitted(self) -> bool:
        """A rollout exists: its admission finished (a v1 key still admitting is not one)."""
        return self.status not in (None, Status.ADMITTING)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


__all__ = ["RolloutRecord"]
