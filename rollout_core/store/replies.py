"""What the store answers besides records: script replies and fleet-wide figures, typed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from rollout_core.store.record import RolloutRecord
from rollout_core.store.schema import AdmitStart, PollOutcome, Status, Verdict


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

    verdict: Verdict
    attempt: int = 0
    since_accepted: float = 0.0  # seconds from admission to this claim
    record: RolloutRecord = field(default_factory=RolloutRecord)

    @property
    def acquired(self) -> bool:
        return self.verdict not in (Verdict.BUSY, Verdict.DONE, Verdict.MISSING)


class WorkerBeat(BaseModel):
    """A live worker process, as its heartbeat announces it."""

    worker: str
    pid: int
    concurrency: int
    inflight: int
    at: float
    sandbox_slots: int = 0  # sandboxed rollouts: trials it runs at most at once
    sandboxes: int = 0  # and runs now


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
    running: int  # held by a worker lease
    finished: int  # finished and still retained


@dataclass(frozen=True)
class FleetFigures:
    """The queue and workers as Redis holds them now (what gateways export as metrics)."""

    queue_depth: int
    oldest_queued_seconds: float  # since admission of the rollout a worker takes next
    counts: FleetCounts
    workers: FleetWorkers


__all__ = [
    "Claim",
    "FleetCounts",
    "FleetFigures",
    "FleetWorkers",
    "PollReply",
    "V1Admission",
    "WorkerBeat",
]
