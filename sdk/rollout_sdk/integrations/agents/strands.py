"""Strands Agents on a rollout (SDK.md §2.10).

``OsmosisStrandsAgent(model=OsmosisRolloutModel(...))`` becomes a Strands agent whose model
talks to the active rollout's TrainGate through Strands' own OpenAI-compatible provider
over the loop's shared client (no litellm: the model path is most of a rollout's CPU), and
which registers itself as the rollout's sample source under its name.
"""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, cast

from rollout_sdk.integrations._imports import missing_extra

try:
    from strands import Agent
    from strands.models.model import Model
    from strands.models.openai import OpenAIModel
    from strands.types.content import Messages
except ModuleNotFoundError as _exc:
    missing_extra(_exc, extra="strands", feature="The Strands integration")

from rollout_sdk.context import SampleSource, get_rollout_context
from rollout_sdk.integrations.openai_client import ROLLOUT_MODEL_NAME, rollout_client
from rollout_sdk.types.sample import RolloutSample

logger = logging.getLogger(__name__)


def _content_blocks(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{"content": "hi"}`` → ``{"content": [{"text": "hi"}]}``; block lists pass through."""
    return [
        {"role": m["role"], "content": [{"text": m["content"]}]}
        if isinstance(m.get("content"), str)
        else dict(m)
        for m in messages
    ]


class StrandsAgentSampleSource(SampleSource):
    """The sample is the agent's native history; the trajectory copy is OpenAI chat format."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def get_sample(self, *args: Any) -> RolloutSample:
        messages = list(self.agent.messages)
        try:
            trajectory = OpenAIModel.format_request_messages(messages)
        except Exception:  # archiving must never fail a rollout
            logger.warning("could not convert Strands messages for the trajectory", exc_info=True)
            trajectory = None
        return RolloutSample(messages=messages, trajectory_messages=trajectory)

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        """The newest messages for live previews; the turn count is the agent's replies,
        unknown once its conversation manager has dropped history."""
        if max_messages <= 0:
            return None
        history = list(self.agent.messages)
        recent = copy.deepcopy(history[-max_messages:])
        try:
            trajectory = OpenAIModel.format_request_messages(recent)
        except Exception:  # a preview is optional; the final trajectory logs its failure
            return None
        removed = getattr(self.agent.conversation_manager, "removed_message_count", 0) > 0
        replies = sum(message.get("role") == "assistant" for message in history)
        return RolloutSample(
            messages=recent,
            trajectory_messages=trajectory,
            extra_fields={
                "_preview_truncated": removed or len(history) > max_messages,
                "_preview_turn": None if removed else replies,
            },
        )


class OsmosisRolloutModel(OpenAIModel):
    """A placeholder for the policy: ``OsmosisStrandsAgent`` swaps in the real model.

    Keeps its keyword arguments (usually ``params={"temperature": 1.0, ...}``; ``stream=False``
    makes plain JSON calls) and may be built at import time, e.g. inside a module-level
    workflow config. Using it directly fails.
    """

    def __init__(self, **model_kwargs: Any) -> None:
        self.model_kwargs = model_kwargs
        self.config = {"model_id": ROLLOUT_MODEL_NAME, **model_kwargs}

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        raise RuntimeError(
            "OsmosisRolloutModel is a placeholder; pass it to OsmosisStrandsAgent inside a "
            "workflow run so it is bound to the active rollout"
        )
        yield  # pragma: no cover - makes this an async generator like Model.stream


def _bind(placeholder: OsmosisRolloutModel, name: str) -> OpenAIModel:
    ctx = get_rollout_context()
    if ctx is None:
        raise RuntimeError(
            "OsmosisRolloutModel needs an active RolloutContext: construct OsmosisStrandsAgent "
            "inside AgentWorkflow.run, where the execution backend has set the context up"
        )
    config = {"model_id": ROLLOUT_MODEL_NAME, **placeholder.model_kwargs}
    return OpenAIModel(client=rollout_client(ctx, sample_id=name), **config)


class OsmosisStrandsAgent(Agent):
    """``strands.Agent`` that binds an ``OsmosisRolloutModel`` to the active rollout and
    registers itself as its sample source (named after the agent)."""

    def __init__(
        self,
        model: Model | str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        if messages:
            messages = _content_blocks(messages)
        if isinstance(model, OsmosisRolloutModel):
            name = kwargs.get("name") or kwargs.get("agent_id") or uuid.uuid4().hex
            model = _bind(model, name)
            ctx = get_rollout_context()
            assert ctx is not None  # _bind checked
            ctx.register_sample_source(name, StrandsAgentSampleSource(self))
        super().__init__(model=model, messages=cast(Messages | None, messages), **kwargs)


__all__ = ["OsmosisRolloutModel", "OsmosisStrandsAgent", "StrandsAgentSampleSource"]
