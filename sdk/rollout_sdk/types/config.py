"""Workflow and grader configuration models (SDK.md §2.6)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field


class ConcurrencyConfig(BaseModel):
    """``max_concurrent`` caps concurrently executing workflows per backend (``None``: no cap)."""

    max_concurrent: int | None = Field(default=None, ge=1)


class BaseConfig(BaseModel):
    """A named config; extra fields are allowed so configs can carry models and tools."""

    model_config: ClassVar[ConfigDict] = ConfigDict(
        extra="allow", validate_assignment=True, arbitrary_types_allowed=True
    )

    name: str
    description: str | None = None


class AgentWorkflowConfig(BaseConfig):
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)


class GraderConfig(BaseConfig):
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)


__all__ = ["AgentWorkflowConfig", "BaseConfig", "ConcurrencyConfig", "GraderConfig"]
