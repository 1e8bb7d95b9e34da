"""The Agent Trajectory Interchange Format (ATIF v1.7) document, as pydantic models.

A finished rollout's sample is archived as one of these (``trajectory.json``). The models
check what the format requires (steps numbered from 1, agent-only fields only on agent
steps, observations that name a tool call of their own step) and refuse NaN/infinity, which
JSON cannot carry. Not part of the public API; ``convert_sample_to_trajectory`` is.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = "ATIF-v1.7"
_AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


class _Document(BaseModel):
    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid", allow_inf_nan=False)


class ImageSource(_Document):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    path: str


class ContentPart(_Document):
    """A text part (``text``) or an image part (``source``), never both."""

    type: Literal["text", "image"]
    text: str | None = None
    source: ImageSource | None = None

    @model_validator(mode="after")
    def _one_payload(self) -> Self:
        if (self.type == "text") != (self.text is not None) or (self.type == "image") != (
            self.source is not None
        ):
            raise ValueError(f"a {self.type} part carries exactly its own payload")
        return self


class Agent(_Document):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class Metrics(_Document):
    """One LLM call's usage (and, from a trainer's report, its exact token ids)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(_Document):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None


class ToolCall(_Document):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class ObservationResult(_Document):
    source_call_id: str | None = None
    content: str | list[ContentPart] | None = None
    extra: dict[str, Any] | None = None


class Observation(_Document):
    results: list[ObservationResult]


class Step(_Document):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str | list[ContentPart]
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    is_copied_context: bool | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None

    @field_validator("timestamp")
    @classmethod
    def _iso_8601(cls, value: str | None) -> str | None:
        if value is not None:
            datetime.fromisoformat(value.replace("Z", "+00:00"))  # ValueError when not
        return value

    @model_validator(mode="after")
    def _agent_fields_on_agent_steps(self) -> Self:
        if self.source != "agent":
            present = [name for name in _AGENT_ONLY if getattr(self, name) is not None]
            if present:
                raise ValueError(f"{present[0]!r} is only allowed on agent steps")
        elif self.llm_call_count == 0 and (self.metrics or self.reasoning_content):
            raise ValueError("a step without an LLM call has no metrics or reasoning")
        return self


class Trajectory(_Document):
    schema_version: str = SCHEMA_VERSION
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: Agent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _numbered_and_linked(self) -> Self:
        for index, step in enumerate(self.steps, start=1):
            if step.step_id != index:
                raise ValueError(f"step {index} has step_id {step.step_id}")
            calls = {call.tool_call_id for call in step.tool_calls or ()}
            for result in step.observation.results if step.observation else ():
                if result.source_call_id is not None and result.source_call_id not in calls:
                    raise ValueError(
                        f"step {index} observes tool call {result.source_call_id!r} it did not make"
                    )
        return self

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, mode="json")


_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
# A list json.dumps(indent=2) spread over lines: a "[" ending its line cannot be inside a
# string (strings escape their line breaks), so text that only looks like a list is kept.
_NUMBER_LIST = re.compile(rf"\[\n\s*{_NUMBER}(?:,\n\s*{_NUMBER})*\n\s*\]")


def format_trajectory_json(document: dict[str, Any]) -> str:
    """Indented JSON, with lists of numbers (token ids, logprobs) kept on one line each."""
    text = json.dumps(document, indent=2, allow_nan=False)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(re.findall(_NUMBER, m.group(0))) + "]", text)


__all__: list[str] = []
