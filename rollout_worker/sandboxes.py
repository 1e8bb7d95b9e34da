"""Sandboxes nobody owns any more, removed.

A trial's backend removes its sandbox when the trial ends. What it cannot remove is the
sandbox of an execution that stopped without ending its trial: a worker killed with
``kill -9``, a host that died, a worker frozen past its lease whose rollout moved on. Every
sandbox carries its owner's labels (``rollout_sdk.backend.harbor.sandbox``): the fleet, the
rollout's record and the execution. One worker at a time, every lease, lists this fleet's
labelled sandboxes on its Docker engine and removes each whose execution no longer holds its
rollout (finished, requeued, run by another execution, or expired). A worker started while
its sandboxes still ran on the same engine finds them on its first look.

The fleet's label is its key prefix and deployment id (``runtime.sandbox_fleet``): fleets on
other Redis databases may share the prefix and the engine. If Redis loses the fleet's state
(and with it the deployment id), the sandboxes of the old deployment are no longer judged by
anyone; remove them by their fleet label.

A sandbox is left alone while its record names its execution: a frozen worker's sandbox goes
once its lease lapses and the sweeper requeues the rollout, within about two leases.
"""

from __future__ import annotations

import logging

from rollout_core.settings import FleetSettings
from rollout_core.store import RecordKey, RecordStore
from rollout_sdk.backend.harbor.engine import EngineError, LabelledSandbox, SandboxEngine
from rollout_worker import metrics

logger = logging.getLogger(__name__)


class SandboxJanitor:
    def __init__(
        self, store: RecordStore, engine: SandboxEngine, fleet: str, settings: FleetSettings
    ) -> None:
        self._store = store
        self._engine = engine
        self._fleet = fleet
        self._every = settings.lease_seconds
        self._engine_down_logged = False

    async def sweep(self) -> int:
        """Remove this fleet's orphaned sandboxes (one worker per lease); how many."""
        if not await self._store.take_turn("sandboxes", self._every):
            return 0
        try:
            found = await self._engine.labelled_sandboxes(self._fleet)
        except EngineError as exc:
            if not self._engine_down_logged:
                logger.warning("sandbox sweep: the Docker engine did not answer: %s", exc)
                self._engine_down_logged = True
            return 0
        self._engine_down_logged = False
        removed = 0
        for sandbox in found:
            if await self._owned(sandbox):
                continue
            try:
                await self._engine.remove_project(sandbox.project)
            except EngineError as exc:
                logger.warning("could not remove sandbox %s: %s", sandbox.project, exc)
                continue
            removed += 1
            metrics.SANDBOXES_REMOVED.inc()
            logger.warning(
                "rollout %s: removed the sandbox %s of execution %s, which no longer holds it",
                sandbox.rollout,
                sandbox.project,
                sandbox.execution,
            )
        return removed

    async def _owned(self, sandbox: LabelledSandbox) -> bool:
        if not self._store.keys.owns(sandbox.record):
            return True  # not a record of this fleet: not ours to judge
        holder = await self._store.execution_of(RecordKey(sandbox.record))
        return bool(holder == sandbox.execution)


__all__ = ["SandboxJanitor"]
