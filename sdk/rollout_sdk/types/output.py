"""What ``AgentWorkflow.run`` may return (SDK.md §2.2)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

Messages = list[dict[str, Any]]


class AgentWorkflowOutput(BaseModel):
    """One message history plus optional measurements; ``info`` is reserved (not graded)."""

    model_config: ClassVar[ConfigDict] = ConfigDict(
        extra="forbid", allow_inf_nan=False, revalidate_instances="always"
    )

    messages: Messages | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)


class UnsupportedOutputError(TypeError):
    """``run`` returned something that is neither an output, a message list nor ``None``."""


def coerce_output(value: Any) -> AgentWorkflowOutput | None:
    """Normalize a ``run`` return value; ``None`` means "take the sample source's sample"."""
    if value is None:
        return None
    if isinstance(value, AgentWorkflowOutput):
        return AgentWorkflowOutput.model_validate(value)
    if isinstance(value, list):
        return AgentWorkflowOutput(messages=value)
    raise UnsupportedOutputError(
        "run() must return AgentWorkflowOutput, a message list, or None; "
        f"got {type(value).__name__}"
    )


__all__ = ["AgentWorkflowOutput", "Messages", "UnsupportedOutputError", "coerce_output"]
