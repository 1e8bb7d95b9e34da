"""The vocabulary of the fleet's Redis state, defined once for Python and Lua.

Every Redis key the fleet touches, every field of a rollout's record, every status and every
word a script answers with lives here. The Lua scripts never spell them: when the store loads
the scripts it puts :func:`lua_prelude` in front of each, which declares these same names as
Lua locals (``FIELD.status``, ``STATUS.queued``, ``LEASES``, ...). ``tests/test_store_schema.py``
fails if a script spells one of them itself.

A rollout's record is one hash, ``<prefix>:<protocol>:<record id>`` (the record id is the v2
rollout id, or the v1 idempotency key). Sorted sets index the records:

* ``leases``       record → worker lease expiry (ms); a lapsed entry means its worker died;
* ``active``       record → admission time, while unfinished;
* ``finished``     record → retention expiry, once finished;
* ``poll-leases``  v2 record → the trainer's polling lease deadline (``Keys.polling_leases``);
* ``clock``        hash: when a fleet process last reached Redis (``ClockField``), the
                   clock polling deadlines run on (see ``POLLING_CLOCK_GAP_SECONDS``);
* ``v2-ids``       v2 record ids, for cancel by prefix;
* ``workers``      worker → heartbeat expiry (s); each worker's beat is ``worker:<name>``;
* ``turn:<chore>``  held by the one worker doing a fleet-wide chore this period;
* ``lost-suspects`` rollouts the last check found waiting without a message;
* ``key-canary``   a known value sealed with the gateways' secret key (workers check it).

A v1 rollout admitted with an idempotency key other than its rollout id also has an alias,
``<prefix>:v1-id:<rollout id>`` → its record key (the newest such admission's), so it is found
by either; the alias lives exactly as long as its record.

Besides these, the fleet uses the Celery queue (a list named by ``ROLLOUT_FLEET_QUEUE``) and
kombu's ``unacked`` / ``unacked_index``, whose names kombu sets (``UNACKED*`` below).

v2 records' status changes are published on ``<prefix>:changes`` (long-polls wake on them;
v1 has none), requests to stop an execution on ``<prefix>:stops``. Every record (and worker
beat) has a TTL; index entries go when their records do. Statuses only move forward::

    admitting → queued → running (→ grading) (→ delivering) → success | failure | cancelled
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NewType, get_args

Protocol = Literal["v1", "v2"]
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)

RecordKey = NewType("RecordKey", str)
"""The Redis key of one rollout's record (``<prefix>:<protocol>:<record id>``)."""

# kombu's Redis transport keeps the messages workers took and have not acked yet here
# (the same names for every fleet on the Redis database; the Celery app configures them).
UNACKED = "unacked"  # delivery tag → [message, exchange, routing key]
UNACKED_INDEX = "unacked_index"  # delivery tag → when it was taken (epoch seconds)
UNACKED_MUTEX = "unacked_mutex"  # kombu's lock over restoring them
# No fleet's queue may be named like these (a script would meet a value of the wrong type):
# kombu's keys, its bindings, the queue registry (``fleet.py``).
RESERVED_NAMES = (UNACKED, UNACKED_INDEX, UNACKED_MUTEX)
RESERVED_PREFIXES = ("_kombu.", "_rollout_fleet.")


class Status(StrEnum):
    """Where a rollout is; only ever moves forward."""

    ADMITTING = "admitting"  # v1: its admission key is held, get_tools() runs; not a rollout yet
    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    DELIVERING = "delivering"  # v1: the result is stored; the callback is being posted
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"

    def precedes(self, other: Status) -> bool:
        """Earlier than ``other`` in the order above."""
        order = list(Status)
        return order.index(self) < order.index(other)


TERMINAL = frozenset({Status.SUCCESS, Status.FAILURE, Status.CANCELLED})
LEASED = frozenset({Status.RUNNING, Status.GRADING, Status.DELIVERING})  # under a worker lease
WAITING = frozenset({Status.QUEUED, Status.DELIVERING})  # when not leased: needs a worker


# A message on ``<prefix>:changes`` is "<status><CHANGE_SEPARATOR><record key>" (a status has
# no space): a long-poll woken by a change that is not final answers without reading the record.
CHANGE_SEPARATOR = " "


@dataclass(frozen=True)
class Change:
    """A record's status moved (what the scripts publish on ``<prefix>:changes``)."""

    key: RecordKey
    status: Status

    @classmethod
    def read(cls, message: str) -> Change:
        status, _, key = message.partition(CHANGE_SEPARATOR)
        return cls(RecordKey(key), Status(status))


class RecordField(StrEnum):
    """The fields of a rollout's record hash."""

    STATUS = "status"
    PROTOCOL = "protocol"
    ROLLOUT_ID = "rollout_id"
    REQUEST = "request"  # the admitted request as JSON, without its API key
    SECRET = "secret"  # the request's API key, sealed (emptied when the rollout finishes)
    RESPONSE = "response"  # v1: the 202 body, replayed to duplicates
    RESULT = "result"  # v1: the completion body; v2: the wire result
    ADMIT_TOKEN = "admit_token"  # v1: which admission holds (or held) the key
    LEASE_DIGEST = "lease_digest"  # v2: digest of the trainer's polling lease token
    ACCEPTED_AT = "accepted_at"  # times in ms since the epoch, by Redis's clock
    STARTED_AT = "started_at"  # the first claim
    CLAIMED_AT = "claimed_at"  # the latest claim
    FINISHED_AT = "finished_at"
    ATTEMPT = "attempt"  # executions started (hand-backs excepted)
    # Crashes not counted against its attempts: its worker ran other rollouts too, so the crash
    # may have been theirs (``_prelude.lua``, forgive_shared_crash).
    FORGIVEN = "forgiven"
    ALONE = "alone"  # the execution that ran it with no other rollout on its worker
    DELIVERIES = "deliveries"  # v1: claims of its stored result, to deliver (its own budget)
    # Times a stopping worker handed it back. The stored name predates "hand back"; records
    # of a fleet upgraded in place keep their count under it, so it stays.
    HANDED_BACK = "handoffs"
    TERMINATIONS = "terminations"  # times it was made terminal: anything but 1 is a bug
    EXECUTION = "execution"  # the execution holding the worker lease (empty once finished)
    # The execution whose write ended it: that write sent again (redis-py retries a command whose
    # reply timed out, and the first may have landed) answers what it did, not "lost".
    ENDED_BY = "ended_by"
    WORKER = "worker"  # the worker process that claimed it last
    TASK = "task"  # the Celery task id of the message it runs under (what Revoke names)
    CANCEL_REQUESTED = "cancel_requested"
    ABANDON_REASON = "abandon_reason"  # a worker gave it up: its next claim fails it so
    RESENT_AT = "resent_at"  # its lost message was replaced (ms)
    UNCONFIRMED = "unconfirmed"  # v2: admitted, not yet on the replicas it waits for (replicated)
    DELIVERY = "delivery"  # v1: how the completion callback went
    TURNS = "turns"  # each LLM turn's token ids, logprobs and usage (JSON; v2: and its sample)
    TRAJECTORY = "trajectory"  # v2: trajectory_messages, when they differ from messages
    TRACEPARENT = "traceparent"  # W3C trace context of the admission
    TRACESTATE = "tracestate"


TRACE_FIELDS = (RecordField.TRACEPARENT, RecordField.TRACESTATE)


class ClockField(StrEnum):
    """The fields of ``<prefix>:clock``: the polling leases' clock (``_prelude.lua``)."""

    TICK = "tick"  # Redis's time (ms) when a fleet process last reached it
    OUTAGES = "outages"  # how many times it found nobody had for longer than the gap
    AWAY_MS = "away_ms"  # the last such time (ms): what the polling deadlines were moved by
    AWAY_AT = "away_at"  # when that was found (ms)


class MemoryField(StrEnum):
    """The fields of ``<prefix>:memory``: the fleet's own memory figures (``_prelude.lua``)."""

    # A running mean of the bytes finishing a record added to Redis: its result, the fields
    # the end wrote, and FINISH_OVERHEAD_BYTES for its index entries and encoding. Gateways
    # keep that much room (times a factor) for every unfinished rollout (docs/OPERATIONS.md).
    FINISH_BYTES = "finish_bytes"


# What finishing a record adds to Redis besides the bytes of what it writes: its entry in
# the finished index, the fields' own overhead.
FINISH_OVERHEAD_BYTES = 256
# The running mean of the finish bytes moves by 1/FINISH_BYTES_WEIGHT of each new figure's
# difference from it: a few dozen finishes of a new size bring it most of the way there.
FINISH_BYTES_WEIGHT = 32

# Time the fleet's Redis could not answer does not count against a trainer's polling lease
# (P§2.7): every fleet process reaches Redis every POLLING_CLOCK_TICK_SECONDS to say it could,
# and a script that finds nobody did for longer than POLLING_CLOCK_GAP_SECONDS moves every
# polling deadline still running then on by that time (``polling_now`` in ``_prelude.lua``).
POLLING_CLOCK_TICK_SECONDS = 1.0
POLLING_CLOCK_GAP_SECONDS = 3.0
POLLING_CLOCK_RESOLUTION_SECONDS = 0.5  # a tick younger than this is not written again

# A crash of a worker running other rollouts too is not counted against a rollout's attempts
# (``forgive_shared_crash`` in ``_prelude.lua``); one forgiven this many times runs alone from
# then on (``rollout_worker/execution.py``). Forgiveness is bounded too: max_attempts + this
# (a rollout waiting for its turn to run alone can die with one that runs alone).
ALONE_AFTER_FORGIVEN = 2


# --- what the scripts answer ------------------------------------------------------------------


class AdmitStart(StrEnum):
    """v1 admission, first step (``admit_begin``)."""

    LEAD = "lead"  # this admission took the admission key: prepare and commit it
    WAIT = "wait"  # another admission of the key is in progress
    REPLAY = "replay"  # the key is known: answer with its stored 202 body


class AdmitOutcome(StrEnum):
    """v2 admission (``admit_v2``), checks in the protocol's order."""

    QUEUED = "queued"
    DRAINING = "draining"
    FULL = "full"
    DUPLICATE = "duplicate"


class PollOutcome(StrEnum):
    """A trainer's poll of a v2 rollout (``poll``)."""

    UNKNOWN = "unknown"
    FORBIDDEN = "forbidden"  # the lease token is not this rollout's
    FINAL = "final"  # finished: here is the stored result
    STATUS = "status"  # not finished: here is its status


class CancelOutcome(StrEnum):
    """What cancelling one rollout did (``cancel``)."""

    CANCELLED_QUEUED = "cancelled_queued"
    CANCELLED_RUNNING = "cancelled_running"
    FINISHED = "finished"  # it had finished already: nothing to cancel
    UNKNOWN = "unknown"


class Advance(StrEnum):
    """What moving a rollout on did (``advance``)."""

    MOVED = "moved"
    CANCELLED = "cancelled"  # cancel was requested: the cancelled result was stored instead
    LOST = "lost"  # this execution no longer holds the rollout: nothing was written


class Verdict(StrEnum):
    """What a worker's claim found (``claim``)."""

    RUNNING = "running"  # run it
    DELIVERING = "delivering"  # a result is stored; deliver it
    CANCELLED = "cancelled"  # cancellation was requested: record that, do not run
    EXHAUSTED = "exhausted"  # too many attempts: fail the rollout
    ABANDONED = "abandoned"  # a worker gave it up (its abandon reason): fail the rollout
    BUSY = "busy"  # another live execution holds its lease (a duplicate message)
    DONE = "done"  # already finished
    MISSING = "missing"  # no such record (expired)


# The enums the scripts see, by the name of their Lua table.
LUA_VOCABULARY: Mapping[str, type[StrEnum]] = {
    "STATUS": Status,
    "FIELD": RecordField,
    "START": AdmitStart,
    "ADMIT": AdmitOutcome,
    "POLL": PollOutcome,
    "CANCEL": CancelOutcome,
    "VERDICT": Verdict,
    "ADVANCE": Advance,
    "CLOCK_FIELD": ClockField,
    "MEMORY_FIELD": MemoryField,
}
LUA_SETS: Mapping[str, frozenset[Status]] = {
    "TERMINAL": TERMINAL,
    "LEASED": LEASED,
    "WAITING": WAITING,
}


@dataclass(frozen=True)
class Keys:
    """Every key a fleet with this prefix owns."""

    prefix: str

    def record(self, protocol: Protocol, record_id: str) -> RecordKey:
        return RecordKey(f"{self.records_of(protocol)}{record_id}")

    def records_of(self, protocol: Protocol) -> str:
        """What the keys of one protocol's records start with."""
        return f"{self.prefix}:{protocol}:"

    def owns(self, key: str) -> bool:
        """Whether ``key`` is a rollout record of this fleet (kombu's ``unacked`` set is
        shared by every fleet on a Redis database: each sweeper touches only its own)."""
        return any(key.startswith(self.records_of(protocol)) for protocol in PROTOCOLS)

    def record_id(self, key: str) -> str:
        """The id part of a record key (``<prefix>:<protocol>:<id>`` → ``<id>``)."""
        return key.removeprefix(f"{self.prefix}:").split(":", 1)[-1]

    def protocol(self, key: str) -> Protocol:
        protocol = key.removeprefix(f"{self.prefix}:").split(":", 1)[0]
        if protocol not in PROTOCOLS:
            raise ValueError(f"{key!r} is not a rollout record of this fleet")
        return protocol

    def v1_alias(self, rollout_id: str) -> str:
        """The key naming the record of the v1 rollout ``rollout_id`` (see module)."""
        return f"{self.v1_aliases}{rollout_id}"

    @property
    def v1_aliases(self) -> str:
        return self._named("v1-id:")

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    def turn(self, chore: str) -> str:
        return f"{self.prefix}:turn:{chore}"

    def _named(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    @property
    def leases(self) -> str:
        return self._named("leases")

    @property
    def active(self) -> str:
        return self._named("active")

    @property
    def finished(self) -> str:
        return self._named("finished")

    @property
    def polling_leases(self) -> str:
        # The stored name predates the word "polling lease": a fleet upgraded in place must
        # keep finding the deadlines its running rollouts already have.
        return self._named("poll-leases")

    @property
    def clock(self) -> str:
        return self._named("clock")

    @property
    def v2_ids(self) -> str:
        return self._named("v2-ids")

    @property
    def draining(self) -> str:
        return self._named("draining")

    @property
    def changes(self) -> str:
        return self._named("changes")

    @property
    def stops(self) -> str:
        return self._named("stops")

    @property
    def memory(self) -> str:
        """The fleet's memory figures (:class:`MemoryField`)."""
        return self._named("memory")

    @property
    def fleet_key(self) -> str:
        return self._named("fleet-key")

    @property
    def key_canary(self) -> str:
        """A known value sealed with the gateways' secret key: a worker that cannot open it
        refuses to start (``rollout_core/secrets.py``)."""
        return self._named("key-canary")

    @property
    def shared_settings(self) -> str:
        """The settings every process of the fleet must agree on, as the live ones have them
        (``rollout_core/durability.py``); it lapses a while after the last one stops."""
        return self._named("settings")

    @property
    def gateway_settings(self) -> str:
        """What every gateway of the fleet must agree on besides (its API key's HMAC), as
        the live ones have it; it lapses as :attr:`shared_settings` does."""
        return self._named("gateway-settings")

    @property
    def fleet_queue(self) -> str:
        """The queue this prefix's fleet uses (the first of its processes registered it)."""
        return self._named("queue")

    @property
    def deployment(self) -> str:
        return self._named("deployment")

    @property
    def workers(self) -> str:
        return self._named("workers")

    @property
    def lost_suspects(self) -> str:
        return self._named("lost-suspects")

    def lua_names(self) -> dict[str, str]:
        """The keys the scripts name (besides the ones passed as KEYS), by Lua local."""
        return {
            "LEASES": self.leases,
            "ACTIVE": self.active,
            "FINISHED": self.finished,
            "POLLING_LEASES": self.polling_leases,
            "CLOCK": self.clock,
            "MEMORY": self.memory,
            "V2IDS": self.v2_ids,
            "DRAINING": self.draining,
            "CHANGES": self.changes,
            "STOPS": self.stops,
            "V2_RECORDS": self.records_of("v2"),
            "V1_ALIASES": self.v1_aliases,
        }


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lua string literal here


def _lua_table(entries: Iterable[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"[{_lua_string(k)}] = {v}" for k, v in entries) + "}"


def lua_prelude(keys: Keys) -> str:
    """The Lua locals every script starts with: key names, vocabulary and status sets."""
    lines = ["-- Generated by rollout_core/store/schema.py: the names below are defined there."]
    lines += [f"local {name} = {_lua_string(key)}" for name, key in keys.lua_names().items()]
    lines.append(f"local CHANGE_SEPARATOR = {_lua_string(CHANGE_SEPARATOR)}")
    lines.append(f"local POLLING_CLOCK_GAP_MS = {int(POLLING_CLOCK_GAP_SECONDS * 1000)}")
    lines.append(f"local ALONE_AFTER_FORGIVEN = {ALONE_AFTER_FORGIVEN}")
    lines.append(f"local FINISH_OVERHEAD_BYTES = {FINISH_OVERHEAD_BYTES}")
    lines.append(f"local FINISH_BYTES_WEIGHT = {FINISH_BYTES_WEIGHT}")
    resolution = int(POLLING_CLOCK_RESOLUTION_SECONDS * 1000)
    lines.append(f"local POLLING_CLOCK_RESOLUTION_MS = {resolution}")
    for table, enum in LUA_VOCABULARY.items():
        entries = ((member.value, _lua_string(member.value)) for member in enum)
        lines.append(f"local {table} = {_lua_table(entries)}")
    for name, statuses in LUA_SETS.items():
        lines.append(f"local {name} = {_lua_table((s.value, 'true') for s in sorted(statuses))}")
    return "\n".join(lines) + "\n"


__all__ = [
    "ALONE_AFTER_FORGIVEN",
    "CHANGE_SEPARATOR",
    "FINISH_BYTES_WEIGHT",
    "FINISH_OVERHEAD_BYTES",
    "LEASED",
    "LUA_SETS",
    "LUA_VOCABULARY",
    "POLLING_CLOCK_GAP_SECONDS",
    "POLLING_CLOCK_RESOLUTION_SECONDS",
    "POLLING_CLOCK_TICK_SECONDS",
    "PROTOCOLS",
    "RESERVED_NAMES",
    "RESERVED_PREFIXES",
    "TERMINAL",
    "TRACE_FIELDS",
    "UNACKED",
    "UNACKED_INDEX",
    "UNACKED_MUTEX",
    "WAITING",
    "AdmitOutcome",
    "AdmitStart",
    "Advance",
    "CancelOutcome",
    "Change",
    "ClockField",
    "Keys",
    "MemoryField",
    "PollOutcome",
    "Protocol",
    "RecordField",
    "RecordKey",
    "Status",
    "Verdict",
    "lua_prelude",
]
