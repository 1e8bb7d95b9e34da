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


__all__ = ["LUA", "PRELUDE", "Script"]
