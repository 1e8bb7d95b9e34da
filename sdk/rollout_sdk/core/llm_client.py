"""The structural interface a :class:`~rollout_sdk.core.base.RolloutContext` needs from its LLM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rollout_sdk.client import CompletionsResult
    from rollout_sdk.core.schemas import MessageDict, RolloutMetrics


@runtime_checkable
class LLMClientProtocol(Protocol):
    """Anything that can answer chat calls and report its metrics can back a rollout."""

    async def chat_completions(
        self, messages: list[MessageDict], **kwargs: Any
    ) -> CompletionsResult: ...

    def get_metrics(self) -> RolloutMetrics: ...


__all__ = ["LLMClientProtocol"]
