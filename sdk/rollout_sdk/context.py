"""The ambient rollout context integrations read, and the contexts workflows and graders get
(SDK.md §2.3, §2.5).

Both upstream shapes are supported: the seed shape registers *named* sample sources
(``register_sample_source``, several per rollout, graded via ``samples``), the 0.3 shape one
unnamed source (``set_sample_source``, graded via ``sample``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rollout_sdk.types.config import AgentWorkflowConfig
from rollout_sdk.types.sample import RolloutSample, RolloutStatus

logger = logging.getLogger(__name__)

CHAT_COMPLETIONS_URL_ENV = "OSMOSIS_CHAT_COMPLETIONS_URL"
API_KEY_ENV = "OSMOSIS_API_KEY"
ROLLOUT_ID_ENV = "OSMOSIS_ROLLOUT_ID"


class SampleSource(ABC):
    """Produces a rollout sample on demand (called at collection time: the final state)."""

    @abstractmethod
    async def get_sample(self, *args: Any) -> RolloutSample:
        """The sample; seed-shape sources take the registered name as an argument."""

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        """The conversation so far for live previews (at most ``max_messages`` recent
        messages, with ``trajectory_messages``), or ``None`` for none. Optional
        ``extra_fields``: ``_preview_truncated`` (older messages were left out) and
        ``_preview_turn`` (the agent's turn count)."""
        return None


def _takes_name(source: SampleSource) -> bool:
    parameters = inspect.signature(source.get_sample).parameters.values()
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters
    )


StatusHook = Callable[[RolloutStatus], Awaitable[None]]


@dataclass
class RolloutProgress:
    """A rollout's live status; waiters wake on every change, terminal is sticky."""

    status: RolloutStatus = RolloutStatus.QUEUED
    on_status: StatusHook | None = field(default=None, repr=False)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition, repr=False)

    async def set_status(self, status: RolloutStatus) -> None:
        async with self.changed:
            if status is self.status or self.status.terminal:
                return
            self.status = status
            self.changed.notify_all()
        if self.on_status is not None:
            await self.on_status(status)

    async def wait_for_change(self) -> RolloutStatus:
        async with self.changed:
            if not self.status.terminal:
                seen = self.status
                await self.changed.wait_for(lambda: self.status is not seen)
            return self.status


_current: ContextVar[RolloutContext | None] = ContextVar("rollout_context", default=None)


@dataclass
class RolloutContext:
    """Where this rollout's policy lives, and what produces its samples.

    Empty fields fall back to ``OSMOSIS_CHAT_COMPLETIONS_URL`` / ``OSMOSIS_API_KEY`` /
    ``OSMOSIS_ROLLOUT_ID``. ``with ctx:`` makes it current for integrations.
    """

    chat_completions_url: str = ""
    api_key: str | None = field(default=None, repr=False)
    rollout_id: str = ""
    sample_sources: dict[str, SampleSource] = field(default_factory=dict)
    progress: RolloutProgress | None = None
    current_sample_id: str | None = None  # the sample the conversation in progress belongs to
    # False keeps the rest of this rollout out of live previews (trajectory/preview.py).
    preview_enabled: bool = True
    _tokens: list[Token[RolloutContext | None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.chat_completions_url = self.chat_completions_url or os.environ.get(
            CHAT_COMPLETIONS_URL_ENV, ""
        )
        self.api_key = self.api_key or os.environ.get(API_KEY_ENV)
        self.rollout_id = self.rollout_id or os.environ.get(ROLLOUT_ID_ENV, "")

    def __enter__(self) -> RolloutContext:
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, *_: object) -> None:
        _current.reset(self._tokens.pop())

    @property
    def sample_source(self) -> SampleSource | None:
        """The first registered source (0.3 shape)."""
        return next(iter(self.sample_sources.values()), None)

    def set_sample_source(self, source: SampleSource) -> None:
        """Register the rollout's only sample source (0.3 shape)."""
        if self.sample_sources:
            raise ValueError(
                "RolloutContext already has a sample source registered. A rollout produces "
                "one sample; construct a single agent/session per rollout."
            )
        self.sample_sources[self.rollout_id or "default"] = source

    def register_sample_source(self, name: str, source: SampleSource) -> None:
        """Register a named sample source (seed shape); the name becomes the sample id."""
        if name in self.sample_sources:
            raise ValueError(
                f"a sample source named {name!r} is already registered in this rollout; "
                "give each agent/session its own name"
            )
        self.sample_sources[name] = source

    async def _collect(self, name: str, source: SampleSource) -> RolloutSample:
        sample = await (source.get_sample(name) if _takes_name(source) else source.get_sample())
        return sample if sample.id else sample.model_copy(update={"id": name})

    async def get_samples(self) -> dict[str, RolloutSample]:
        return {name: await self._collect(name, s) for name, s in self.sample_sources.items()}

    async def get_sample(self) -> RolloutSample | None:
        """The rollout's sample: the first registered source's."""
        samples = await self.get_samples()
        return next(iter(samples.values()), None)

    async def set_status(self, status: RolloutStatus) -> None:
        if self.progress is not None:
            await self.progress.set_status(status)


def get_rollout_context() -> RolloutContext | None:
    return _current.get()


TConfig = TypeVar("TConfig", bound=AgentWorkflowConfig)


@dataclass
class AgentWorkflowContext[TConfig: AgentWorkflowConfig]:
    """What ``AgentWorkflow.run`` gets. The label is deliberately absent: grading's job."""

    prompt: list[dict[str, Any]]
    config: TConfig | None = None
    metadata: dict[str, Any] | None = None
    artifacts_dir: Path | None = None


@dataclass
class GraderContext:
    """What ``Grader.grade`` gets: the label and the rollout's sample(s) to reward."""

    label: str | None = None
    sample: RolloutSample | None = None
    samples: dict[str, RolloutSample] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    project_path: str | None = None
    artifacts_dir: Path | None = None

    def set_reward(self, reward: float) -> None:
        if self.sample is None:
            raise ValueError("GraderContext has no sample to reward")
        self.sample.reward = reward

    def set_sample_reward(self, sample_id: str, reward: float) -> None:
        sample = self.samples.get(sample_id)
        if sample is None:
            raise ValueError(f"Sample {sample_id} not found")
        sample.reward = reward

    def get_samples(self) -> dict[str, RolloutSample]:
        return self.samples


__all__ = [
    "API_KEY_ENV",
    "CHAT_COMPLETIONS_URL_ENV",
    "ROLLOUT_ID_ENV",
    "AgentWorkflowContext",
    "GraderContext",
    "RolloutContext",
    "RolloutProgress",
    "SampleSource",
    "get_rollout_context",
]
