"""What a worker knows of a backend that runs rollouts in sandboxes.

A worker hosting such a backend gives it the operator's settings (:class:`SandboxSettings`),
checks its engine before it takes rollouts, builds its images ahead, prunes what its trials
leave on disk, publishes its figures, and runs the janitor over the backend's engine. The
backend declares all of that by being a :class:`SandboxedBackend`; nothing is looked up by
name. ``HarborBackend`` is one; a Kubernetes pod backend would be another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rollout_sdk.backend.harbor.engine import SandboxEngine


@dataclass(frozen=True)
class SandboxSettings:
    """The operator's limits for every sandbox a worker runs (FleetSettings' ``sandbox_*``)."""

    slots: int | None = None
    build_network: str = "none"
    egress: str = "traingate"
    log_retention_seconds: float | None = None
    folder: str | None = None
    memory_mb: int = 2048
    pids: int = 512
    cpus: float = 1.0
    disk_mb: int = 4096
    output_mb: int = 64
    trials_mb: int = 2048
    allowed_keys: frozenset[str] = frozenset()
    task_roots: tuple[str, ...] = ()
    task_hosts: frozenset[str] = field(default_factory=frozenset)
    registries: frozenset[str] = frozenset()
    build_hosts: frozenset[str] = frozenset()


@runtime_checkable
class SandboxedBackend(Protocol):
    """A backend whose rollouts each run in a sandbox on an engine."""

    engine: SandboxEngine

    def configure(self, settings: SandboxSettings) -> None:
        """Take the worker's settings, before the first rollout."""

    async def check_engine(self) -> None:
        """Raise one line naming what is missing when the engine cannot run sandboxes."""

    def sandbox_figures(self) -> dict[str, int]:
        """``slots``, ``running``, ``waiting``: for the worker's beat and metrics."""

    async def prewarm(self) -> None:
        """Build what sandboxes need before rollouts arrive."""

    async def prune_trials(self) -> int:
        """Remove what ended trials left on this host beyond the retention and the cap."""


__all__ = ["SandboxSettings", "SandboxedBackend"]
