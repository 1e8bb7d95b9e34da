"""What the store answers besides records (to gateways, workers and the CLI alike): script
replies and fleet-wide figures, typed.

Each Lua script's reply is read by one function of this module (its name is the script's,
or the shape several share: :func:`flag`, :func:`record_keys`), so a reply's layout is known
in one place, next to the script's own ``-- ->`` comment, and callers get typed values: the
store's ``_run`` hands back a raw :data:`Reply`, which only these functions read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import BaseModel

from rollout_core.store import schema
from rollout_core.store.errors import StoreReplyError
from rollout_core.store.record import RolloutRecord
from rollout_core.store.schema import AdmitStart, PollOutcome, RecordField, RecordKey, Status

# A script's reply as the client decodes it: Lua strings, numbers and tables, nil/false as None.
Reply = str | int | list["Reply"] | None


@dataclass(frozen=True)
class V1Admission:
    """The first step of a v1 admission; ``response`` is the stored 202 body of a replay."""

    start: AdmitStart
    response: str | None = None


@dataclass(frozen=True)
class PollReply:
    """A trainer's poll: the stored wire result once final, else the current status."""

    outcome: PollOutcome
    result: str | None = None
    status: Status | None = None


@dataclass(frozen=True)
class Claim:
    """What a worker's claim found, and for an acquired rollout its whole record."""

    verdict: schema.Verdict
    attempt: int = 0
    since_accepted: float = 0.0  # seconds from admission to this claim
    record: RolloutRecord = field(default_factory=RolloutRecord)

    @property
    def acquired(self) -> bool:
        return self.verdict not in (
            schema.Verdict.BUSY,
            schema.Verdict.DONE,
            schema.Verdict.MISSING,
        )


class WorkerBeat(BaseModel):
    """A live worker process, as its heartbeat announces it."""

    worker: str
    pid: int
    concurrency: int
    inflight: int
    at: float
    sandbox_slots: int = 0  # sandboxed rollouts: trials it runs at most at once
    sandboxes: int = 0  # and runs now
    keys: list[str] = []  # prints of the secret keys it holds (SecretBox.prints)


@dataclass(frozen=True)
class FleetWorkers:
    """The worker processes whose heartbeat is current."""

    beats: Sequence[WorkerBeat] = ()

    @property
    def count(self) -> int:
        return len(self.beats)

    @property
    def slots(self) -> int:
        """Rollouts they can run at once: the fleet's capacity."""
        return sum(beat.concurrency for beat in self.beats)

    @property
    def sandbox_slots(self) -> int:
        """Sandboxes they can run at once (0: no worker runs a sandboxed agent)."""
        return sum(beat.sandbox_slots for beat in self.beats)

    @property
    def sandboxes(self) -> int:
        """Sandboxes they run now."""
        return sum(beat.sandboxes for beat in self.beats)


@dataclass(frozen=True)
class FleetCounts:
    active: int  # admitted and not finished
    running: int  # under a worker lease
    finished: int  # finished and still retained


@dataclass(frozen=True)
class FleetFigures:
    """The queue and workers as Redis holds them now (what gateways export as metrics)."""

    queue_depth: int
    oldest_queued_seconds: float  # since admission of the rollout a worker takes next
    counts: FleetCounts
    workers: FleetWorkers


def _items(reply: Reply) -> list[Reply]:
    if not isinstance(reply, list):
        raise StoreReplyError(f"a script answered {reply!r} where a list was due")
    return reply


def _text(reply: Reply) -> str:
    if not isinstance(reply, (str, int)):
        raise StoreReplyError(f"a script answered {reply!r} where a value was due")
    return str(reply)


def _optional_text(reply: Reply) -> str | None:
    return None if reply is None else _text(reply)


def _number(reply: Reply) -> int:
    return int(_text(reply))


def _texts(reply: Reply) -> list[str]:
    return [_text(item) for item in _items(reply)]


def count(reply: Reply) -> int:
    """A number (``WAIT``'s count of replicas that acknowledged)."""
    return _number(reply)


def flag(reply: Reply) -> bool:
    """A script that answers 1 when it changed something and 0 when there was nothing to do
    (``admit_commit``, ``admit_withdraw``, ``expire_polling_lease``, ``hand_back``, ``requeue``,
    ``resend``, ``restore``). ``admit_abort`` and ``prune`` answer nothing anyone reads."""
    return bool(reply)


def record_keys(reply: Reply) -> list[RecordKey]:
    """Records due for a repair (``lapsed``, ``overdue_polling_leases``)."""
    return [RecordKey(key) for key in _texts(reply)]


@dataclass(frozen=True)
class Replayed:
    """``admit_begin`` found the rollout admitted already: its stored 202 body and status."""

    response: str | None
    status: Status


def admit_begin(reply: Reply) -> AdmitStart | Replayed:
    items = _items(reply)
    start = AdmitStart(_text(items[0]))
    if start is not AdmitStart.REPLAY:
        return start
    return Replayed(_optional_text(items[1]), Status(_text(items[2])))


def admit_v2(reply: Reply) -> schema.AdmitOutcome:
    return schema.AdmitOutcome(_text(reply))


def advance(reply: Reply) -> schema.Advance:
    return schema.Advance(_text(reply))


def cancel(reply: Reply) -> schema.CancelOutcome:
    return schema.CancelOutcome(_text(reply))


def claim(reply: Reply) -> Claim:
    """``{verdict}`` when nothing was acquired, else ``{verdict, attempt, ms since admission,
    field, value, field, value…}``."""
    items = _items(reply)
    verdict = schema.Verdict(_text(items[0]))
    if len(items) == 1:
        return Claim(verdict)
    fields = [_text(item) for item in items[3:]]
    record = RolloutRecord.parse(dict(zip(fields[::2], fields[1::2], strict=True)))
    return Claim(verdict, _number(items[1]), _number(items[2]) / 1000, record)


# What a trainer may be told of a record: the fields ``confirm`` reads.
REPLICATED_FIELDS = (
    RecordField.STATUS,
    RecordField.RESPONSE,
    RecordField.RESULT,
    RecordField.LEASE_DIGEST,
)


def confirm(reply: Reply) -> RolloutRecord:
    """The :data:`REPLICATED_FIELDS` of a record (empty: the record is gone)."""
    values = _items(reply) or [None] * len(REPLICATED_FIELDS)
    return RolloutRecord.parse(
        {
            name: _text(value)
            for name, value in zip(REPLICATED_FIELDS, values, strict=True)
            if value is not None
        }
    )


@dataclass(frozen=True)
class Finished:
    """``poll``: the rollout is final, with this wire result (None: the record has none)."""

    result: str | None
    status: Status


@dataclass(frozen=True)
class Unfinished:
    """``poll``: the polling lease was renewed; the rollout's status now."""

    status: Status


def poll(reply: Reply) -> Finished | Unfinished | PollOutcome:
    """The poll's answer; a bare :class:`PollOutcome` when there is nothing more to tell
    (an unknown rollout, a digest that does not match)."""
    items = _items(reply)
    outcome = PollOutcome(_text(items[0]))
    if outcome is PollOutcome.FINAL:
        return Finished(_optional_text(items[1]), Status(_text(items[2])))
    if outcome is PollOutcome.STATUS:
        return Unfinished(Status(_text(items[1])))
    return outcome


class Renewal(NamedTuple):
    """``renew``: executions whose lease was lost, and those whose rollout is to stop."""

    lost: list[str]
    stop: list[str]


def renew(reply: Reply) -> Renewal:
    lost, stop = _items(reply)
    return Renewal(_texts(lost), _texts(stop))


class ClockTicks(NamedTuple):
    """``tick``: the outages the polling clock has found, and the last one's length."""

    outages: int
    last_outage_seconds: float


def tick(reply: Reply) -> ClockTicks:
    outages, away_ms = _items(reply)
    return ClockTicks(_number(outages or 0), _number(away_ms or 0) / 1000)


__all__ = [
    "REPLICATED_FIELDS",
    "Claim",
    "ClockTicks",
    "Finished",
    "FleetCounts",
    "FleetFigures",
    "FleetWorkers",
    "PollReply",
    "Renewal",
    "Replayed",
    "Reply",
    "Unfinished",
    "V1Admission",
    "WorkerBeat",
    "admit_begin",
    "admit_v2",
    "advance",
    "cancel",
    "claim",
    "confirm",
    "count",
    "flag",
    "poll",
    "record_keys",
    "renew",
    "tick",
]
