"""``ExecutionBackend``: what a rollout server runs rollouts on (SDK.md §2.8)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from rollout_sdk.types.sample import ExecutionOutcome, ExecutionRequest


class ExecutionBackend(ABC):
    @property
    def name(self) -> str:
        """What logs, readiness and Flower call the agent this backend runs."""
        return type(self).__name__

    @abstractmethod
    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run one rollout to its outcome (the active RolloutContext is already set)."""

    def has_capacity(self) -> bool:
        """False makes admission answer 429."""
        return True

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        return None

    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        return {}

    def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    async def shutdown(self) -> None:
        return None


__all__ = ["ExecutionBackend"]
