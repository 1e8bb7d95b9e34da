"""``AgentWorkflow``: the v2 agent API (SDK.md §2.2)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic

from rollout_sdk.context import AgentWorkflowContext, TConfig


class AgentWorkflow(ABC, Generic[TConfig]):  # noqa: UP046 (TConfig is shared with the context)
    """Subclass it and implement ``run``. A fresh instance (with a deep copy of the
    config) runs each rollout, so state on ``self`` never leaks between rollouts."""

    def __init__(self, config: TConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def run(self, ctx: AgentWorkflowContext[TConfig]) -> Any:
        """Run the agent on ``ctx.prompt``. Return an ``AgentWorkflowOutput``, a message list,
        or ``None`` (the registered sample source then provides the sample)."""


__all__ = ["AgentWorkflow"]
