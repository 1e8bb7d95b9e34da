"""The record store: the only code in the fleet that issues Redis commands.

Gateways, workers and the CLI call the typed methods of :class:`RecordStore`, which is the
sum of the store's roles, one module each: ``admission`` (gateways), ``execution`` and
``recovery`` (workers), ``fleet`` (fleet-wide state, every side), ``views`` (reads for the
CLI and lookups), all on the shared ``base`` and its ``connection``. Each state change of a
rollout is one Lua script (``lua/``), so it is atomic and costs one round trip. The scripts
share the names of ``schema.py`` (put in front of each as Lua locals) and the helpers of
``lua/_prelude.lua``; their replies are parsed into the types of ``replies.py``.
"""

from __future__ import annotations

from rollout_core.store.admission import Admission
from rollout_core.store.errors import NotReplicated
from rollout_core.store.execution import Execution
from rollout_core.store.fleet import FleetState
from rollout_core.store.recovery import Recovery
from rollout_core.store.views import RecordViews


class RecordStore(Admission, Execution, Recovery, FleetState, RecordViews):
    """Typed access to one fleet's records, queue and fleet-wide state in Redis: every role
    in one object, so a process holds one store (and one connection pool) whatever it does."""


__all__ = ["NotReplicated", "RecordStore"]
