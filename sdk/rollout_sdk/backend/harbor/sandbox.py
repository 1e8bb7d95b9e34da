"""Who owns a sandbox: the labels every object of a trial carries.

Every container and network a trial creates belongs to one Compose project, named for the
trial, and carries the owner's labels (:data:`LABELS`): which fleet, which rollout record and
which execution holds its lease. The backend removes its project when the trial ends however
it ends; whoever finds a labelled project whose execution no longer holds its rollout (a
worker killed with ``kill -9``, a frozen one whose lease moved on) removes it the same way
(``engine.py``).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LABEL_PREFIX = "org.rollout-fleet"
FLEET_LABEL = f"{LABEL_PREFIX}.fleet"
RECORD_LABEL = f"{LABEL_PREFIX}.record"
ROLLOUT_LABEL = f"{LABEL_PREFIX}.rollout"
EXECUTION_LABEL = f"{LABEL_PREFIX}.execution"
PROJECT_LABEL = "com.docker.compose.project"  # Compose sets it on everything it creates
LABELS = (FLEET_LABEL, RECORD_LABEL, ROLLOUT_LABEL, EXECUTION_LABEL)
TRIAL_PREFIX = "rfx-"


@dataclass(frozen=True)
class SandboxOwner:
    """The execution a trial runs for: its labels, and the trial name derived from it."""

    fleet: str
    record: str
    rollout: str
    execution: str

    @property
    def trial_name(self) -> str:
        """Unique per execution, a valid Compose project name whatever the ids hold."""
        digest = hashlib.sha256(f"{self.fleet}\0{self.execution}".encode()).hexdigest()
        return f"{TRIAL_PREFIX}{digest[:20]}"

    def labels(self) -> dict[str, str]:
        return {
            FLEET_LABEL: self.fleet,
            RECORD_LABEL: self.record,
            ROLLOUT_LABEL: self.rollout,
            EXECUTION_LABEL: self.execution,
        }

    def overlay(self) -> dict[str, Any]:
        """A Compose file that labels the trial's main container and default network, and
        stops it at once: its ``sleep infinity`` runs as PID 1, which ignores SIGTERM, so
        every ``compose down`` (each trial's end, a cancel) would wait out Docker's 10 s."""
        labels = self.labels()
        return {
            "services": {"main": {"labels": labels, "stop_grace_period": "1s"}},
            "networks": {"default": {"labels": labels}},
        }


# Set by whoever runs the backend for a rollout (the fleet's worker); unset, a trial is
# labelled as this process's own (see HarborBackend).
current_owner: contextvars.ContextVar[SandboxOwner | None] = contextvars.ContextVar(
    "rollout_sandbox_owner", default=None
)


def write_overlay(owner: SandboxOwner, folder: Path, extra: dict[str, Any] | None = None) -> Path:
    """The trial's Compose overlay: the owner's labels, and ``extra`` (its egress) merged."""
    document = owner.overlay()
    for section, entries in (extra or {}).items():
        for name, body in entries.items():
            merged = document.setdefault(section, {}).setdefault(name, {})
            merged.update(body)
    path = folder / f"{owner.trial_name}.overlay.json"
    path.write_text(json.dumps(document))
    return path


__all__ = [
    "EXECUTION_LABEL",
    "FLEET_LABEL",
    "LABELS",
    "PROJECT_LABEL",
    "RECORD_LABEL",
    "ROLLOUT_LABEL",
    "SandboxOwner",
    "current_owner",
    "write_overlay",
]
