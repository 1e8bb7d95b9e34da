"""``Grader``: rewards a rollout's sample (SDK.md §2.3)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from rollout_sdk.context import GraderContext
from rollout_sdk.types.config import GraderConfig


class Grader(ABC):
    """Subclass it and implement ``grade``: set rewards through the context."""

    def __init__(self, config: GraderConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def grade(self, ctx: GraderContext) -> Any:
        """Reward ``ctx.sample`` (or each of ``ctx.samples``); the return value is ignored."""


__all__ = ["Grader"]
