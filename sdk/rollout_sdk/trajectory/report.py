"""Per-call LLM metrics a trainer may report for a rollout, to enrich its trajectory.

The poll/lease protocol carries no report; v1-era trainers put one in the callback's
acknowledgement (``{"trajectory": {...}}``), which :func:`report_from_response` reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout_sdk.trajectory.atif import Metrics

logger = logging.getLogger(__name__)


class _Lenient(BaseModel):
    model_config: ClassVar[ConfigDict] = ConfigDict(extra="ignore")


class LlmCallMetrics(Metrics):
    """One LLM call, in the order the calls were made: ATIF ``Metrics`` plus the call's
    ``model_name`` (which lives on the step). Unknown fields are ignored, not refused."""

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="ignore", allow_inf_nan=False)

    model_name: str | None = None


class SampleReport(_Lenient):
    model_name: str | None = None
    llm_call_metrics: list[LlmCallMetrics] = Field(default_factory=list)
    final_metrics: dict[str, Any] | None = None


class TrajectoryReport(_Lenient):
    """A report for one rollout: per-sample entries keyed by the trainer's sample id."""

    model_name: str | None = None
    samples: dict[str, SampleReport] = Field(default_factory=dict)


def report_from_response(response: httpx.Response) -> TrajectoryReport | None:
    """The ``trajectory`` object of an acknowledgement body; ``None`` when there is none or
    it is malformed (logged), never an exception."""
    try:
        body = response.json()
    except ValueError:
        return None
    payload = body.get("trajectory") if isinstance(body, Mapping) else None
    if payload is None:
        return None
    try:
        return TrajectoryReport.model_validate(payload)
    except ValidationError:
        logger.warning("ignoring a malformed trajectory report in a callback response")
        return None


__all__ = ["LlmCallMetrics", "SampleReport", "TrajectoryReport", "report_from_response"]
