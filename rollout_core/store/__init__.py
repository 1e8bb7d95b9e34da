"""The fleet's state in Redis: its vocabulary (``schema``), records, the store that is the only
code issuing Redis commands (``store``), and the Lua scripts that change records atomically."""

from rollout_core.store.record import RolloutRecord
from rollout_core.store.replies import (
    Claim,
    FleetCounts,
    FleetFigures,
    FleetWorkers,
    PollReply,
    V1Admission,
    WorkerBeat,
)
from rollout_core.store.schema import (
    HELD,
    PROTOCOLS,
    TERMINAL,
    WAITING,
    AdmitOutcome,
    AdmitStart,
    CancelOutcome,
    Keys,
    PollOutcome,
    Protocol,
    RecordField,
    RecordKey,
    Status,
    Verdict,
)
from rollout_core.store.store import (
    RecordStore,
    StoreError,
    StoreFull,
    StoreReplyError,
    StoreUnavailable,
    answers,
)

__all__ = [
    "HELD",
    "PROTOCOLS",
    "TERMINAL",
    "WAITING",
    "AdmitOutcome",
    "AdmitStart",
    "CancelOutcome",
    "Claim",
    "FleetCounts",
    "FleetFigures",
    "FleetWorkers",
    "Keys",
    "PollOutcome",
    "PollReply",
    "Protocol",
    "RecordField",
    "RecordKey",
    "RecordStore",
    "RolloutRecord",
    "Status",
    "StoreError",
    "StoreFull",
    "StoreReplyError",
    "StoreUnavailable",
    "V1Admission",
    "Verdict",
    "WorkerBeat",
    "answers",
]
