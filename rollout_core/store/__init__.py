"""The fleet's state in Redis: its vocabulary (``schema``), records, the store that is the only
code issuing Redis commands (``store``, made of one module per role), and the Lua scripts that
change records atomically."""

from rollout_core.store.connection import answers, sentinel_primary
from rollout_core.store.errors import (
    NotReplicated,
    StoreAuthError,
    StoreError,
    StoreFull,
    StoreNotRedis,
    StoreReplyError,
    StoreTimeout,
    StoreUnavailable,
)
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
    ALONE_AFTER_FORGIVEN,
    LEASED,
    PROTOCOLS,
    TERMINAL,
    WAITING,
    AdmitOutcome,
    AdmitStart,
    Advance,
    CancelOutcome,
    Change,
    Keys,
    PollOutcome,
    Protocol,
    RecordField,
    RecordKey,
    Status,
    Verdict,
)
from rollout_core.store.store import RecordStore

__all__ = [
    "ALONE_AFTER_FORGIVEN",
    "LEASED",
    "PROTOCOLS",
    "TERMINAL",
    "WAITING",
    "AdmitOutcome",
    "AdmitStart",
    "Advance",
    "CancelOutcome",
    "Change",
    "Claim",
    "FleetCounts",
    "FleetFigures",
    "FleetWorkers",
    "Keys",
    "NotReplicated",
    "PollOutcome",
    "PollReply",
    "Protocol",
    "RecordField",
    "RecordKey",
    "RecordStore",
    "RolloutRecord",
    "Status",
    "StoreAuthError",
    "StoreError",
    "StoreFull",
    "StoreNotRedis",
    "StoreReplyError",
    "StoreTimeout",
    "StoreUnavailable",
    "V1Admission",
    "Verdict",
    "WorkerBeat",
    "answers",
    "sentinel_primary",
]
