"""The v1 agent API: :class:`RolloutAgentLoop`, :class:`RolloutContext`, :class:`RolloutResult`.

An agent author subclasses :class:`RolloutAgentLoop`, declares its tools in ``get_tools`` and
drives the conversation in ``run``; the server builds one :class:`RolloutContext` per rollout.
"""

from __future__ import annotations

import json
import logging
import re
import time
from abc import ABCMeta, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_sdk.core.schemas import (
    MessageDict,
    OpenAIFunctionToolSchema,
    RolloutMetrics,
    RolloutRequest,
    RolloutStatus,
)

if TYPE_CHECKING:
    from rollout_sdk.client import CompletionsResult
    from rollout_sdk.core.llm_client import LLMClientProtocol

logger = logging.getLogger(__name__)


class _AgentLoopMeta(ABCMeta):
    """Rejects a concrete agent loop without a ``name`` when its class is defined."""

    def __new__(
        mcs, cls_name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _AgentLoopMeta:
        cls = super().__new__(mcs, cls_name, bases, namespace, **kwargs)
        is_concrete = bases and not getattr(cls, "__abstractmethods__", None)
        if is_concrete and getattr(cls, "name", None) in (None, ""):
            raise TypeError(
                f"Agent loop class {cls.__name__} must define a 'name' class attribute "
                "(a non-empty string: the agent's unique identifier)"
            )
        return cls


class RolloutAgentLoop(metaclass=_AgentLoopMeta):
    """Base class of a v1 agent: subclass it, set ``name``, implement ``get_tools`` and ``run``."""

    name: str

    @abstractmethod
    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema | dict[str, Any]]:
        """The tools this rollout may use; returned to the trainer in the init response."""

    @abstractmethod
    async def run(self, ctx: RolloutContext) -> RolloutResult:
        """Drive the conversation and return ``ctx.complete(...)`` or ``ctx.error(...)``."""

    def get_default_tools(self) -> list[OpenAIFunctionToolSchema | dict[str, Any]]:
        """``get_tools`` for a synthetic request; used for discovery and validation."""
        return self.get_tools(
            RolloutRequest(
                rollout_id="discovery",
                server_url="http://localhost",
                messages=[],
                completion_params={},
            )
        )


@dataclass
class RolloutResult:
    """What ``run`` returns; the server turns it into the completion callback."""

    status: str
    final_messages: list[MessageDict]
    finish_reason: str | None
    error_message: str | None = None
    metrics: RolloutMetrics | None = None
    reward: float | None = None


_UNSAFE_FILENAME = re.compile(r"[/\\\x00]|^\.+")


def trace_path(debug_dir: str | Path, rollout_id: str) -> Path:
    """``<debug_dir>/<rollout_id>.jsonl``, with path separators in the id made harmless."""
    return Path(debug_dir) / f"{_UNSAFE_FILENAME.sub('_', rollout_id)}.jsonl"


@dataclass
class RolloutContext:
    """Everything ``run`` needs for one rollout. ``_start_time`` is a ``time.monotonic()`` value."""

    request: RolloutRequest
    tools: list[Any]
    llm: LLMClientProtocol
    _start_time: float = 0.0
    _tool_latency_ms: float = 0.0
    _num_tool_calls: int = 0
    _debug_dir: str | None = field(default=None)

    async def chat(self, messages: list[MessageDict], **kwargs: Any) -> CompletionsResult:
        """Ask the current policy for the next turn; ``messages`` must be the full history."""
        return await self.llm.chat_completions(messages, **kwargs)

    def complete(
        self,
        final_messages: list[MessageDict],
        finish_reason: str | None = "stop",
        reward: float | None = None,
    ) -> RolloutResult:
        return RolloutResult(
            status=RolloutStatus.COMPLETED,
            final_messages=final_messages,
            finish_reason=finish_reason,
            metrics=self.metrics(),
            reward=reward,
        )

    def error(
        self, error_message: str, final_messages: list[MessageDict] | None = None
    ) -> RolloutResult:
        return RolloutResult(
            status=RolloutStatus.ERROR,
            final_messages=final_messages if final_messages is not None else [],
            finish_reason="error",
            error_message=error_message,
            metrics=self.metrics(),
        )

    def record_tool_call(self, latency_ms: float = 0.0) -> None:
        self._num_tool_calls += 1
        self._tool_latency_ms += latency_ms

    def metrics(self) -> RolloutMetrics:
        """A snapshot: total latency since acceptance, LLM counters, tool counters."""
        snapshot = self.llm.get_metrics()
        snapshot.total_latency_ms = (
            (time.monotonic() - self._start_time) * 1000 if self._start_time else 0.0
        )
        snapshot.tool_latency_ms = self._tool_latency_ms
        snapshot.num_tool_calls = self._num_tool_calls
        snapshot.max_context_tokens = 0
        return snapshot

    @property
    def debug_enabled(self) -> bool:
        return self._debug_dir is not None

    def log_event(self, event_type: str, **data: Any) -> None:
        """Append one JSON line to this rollout's debug trace; a no-op when debugging is off."""
        if self._debug_dir is None:
            return
        path = trace_path(self._debug_dir, self.request.rollout_id)
        line = json.dumps(
            {"event": event_type, "rollout_id": self.request.rollout_id, **data}, default=str
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as trace:
                trace.write(line + "\n")
        except OSError:
            logger.exception("could not write debug trace %s", path)


__all__ = ["RolloutAgentLoop", "RolloutContext", "RolloutResult", "trace_path"]
