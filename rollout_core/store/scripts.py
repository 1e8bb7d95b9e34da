"""The Lua scripts of ``lua/``, by name: every state change of a rollout is one of them (all
sides run them through the store). A member per file, so a script is called by a name the type
checker knows, and a file nobody calls (or a call of a file that is not there) is found by the
tests rather than at run time.
"""

from __future__ import annotations

from enum import StrEnum
from importlib import resources
from importlib.resources.abc import Traversable

LUA = resources.files("rollout_core.store") / "lua"
PRELUDE = LUA / "_prelude.lua"  # helpers put in front of every script, not one itself


class Script(StrEnum):
    ADMIT_ABORT = "admit_abort"
    ADMIT_BEGIN = "admit_begin"
    ADMIT_COMMIT = "admit_commit"
    ADMIT_V2 = "admit_v2"
    ADMIT_V2_CONFIRMED = "admit_v2_confirmed"
    ADMIT_WITHDRAW = "admit_withdraw"
    ADVANCE = "advance"
    ALONE = "alone"
    CANCEL = "cancel"
    CLAIM = "claim"
    CONFIRM = "confirm"
    EXPIRE_POLLING_LEASE = "expire_polling_lease"
    HAND_BACK = "hand_back"
    LAPSED = "lapsed"
    OVERDUE_POLLING_LEASES = "overdue_polling_leases"
    POLL = "poll"
    PRUNE = "prune"
    RENEW = "renew"
    REQUEUE = "requeue"
    RESEND = "resend"
    RESTORE = "restore"
    TICK = "tick"

    @property
    def file(self) -> Traversable:
        return LUA / f"{self.value}.lua"

    @property
    def refusable(self) -> bool:
        """Whether Redis at ``maxmemory`` refuses the script: only the ones that take new
        work in. Every other one moves work already admitted on (claims, renewals,
        results, hand-backs, requeues, sweeps, cancels, polls) and runs whatever the
        memory, so what was admitted can always end (docs/RELIABILITY.md)."""
        return self in ADMISSIONS

    def text(self, prelude: str, flags: bool) -> str:
        """What Redis runs, ``prelude`` (names and helpers) in front, for a Redis that reads
        script ``flags`` (7.0 on) or not. Redis 7 reads them from the first line:
        ``#!lua flags=allow-oom`` runs the script whatever the memory. Without one, Redis at
        ``maxmemory`` refuses a script only at its first write, and only if that write may
        grow memory (it cannot stop a script midway): before Redis 7 an ``UNLINK`` of a key
        that never exists, a write that changes nothing and propagates nothing, comes first."""
        body = self.file.read_text()
        if self.refusable:
            return prelude + body
        if flags:
            return "#!lua flags=allow-oom\n" + prelude + body
        return prelude + "redis.call('UNLINK', MEMORY .. ':never')\n" + body


# The scripts that take new work in: Redis at ``maxmemory`` refuses them (a trainer hears
# 503 for v1, 429 for v2). A retry after the first reply was lost is one of these too.
ADMISSIONS = frozenset({Script.ADMIT_BEGIN, Script.ADMIT_COMMIT, Script.ADMIT_V2})


__all__ = ["ADMISSIONS", "LUA", "PRELUDE", "Script"]
