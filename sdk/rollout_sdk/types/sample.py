"""The rollout sample, the v2 status vocabulary and the execution models (SDK.md §2.4, §2.8)."""

from __future__ import annotations

import copy
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

logger = logging.getLogger(__name__)

MessageDict = dict[str, Any]
SampleMessage = Mapping[str, Any]

_DROP = object()  # a value with no JSON representation


class RolloutStatus(StrEnum):
    """v2 statuses: lifecycle while in flight, outcome once terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        return self in (RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED)


class RolloutErrorCategory(StrEnum):
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    VALIDATION_ERROR = "validation_error"
    HTTP_ERROR = "http_error"
    AGENT_ERROR = "agent_error"
    INTERNAL_ERROR = "internal_error"


def ensure_single_path_segment(value: str, *, label: str = "rollout_id") -> str:
    """Ids become URL path segments and file names: one plain segment only."""
    if (
        not value
        or value in (".", "..")
        or any(c in value for c in "/\\\x00")
        or value.rsplit("/", 1)[-1] != value
    ):
        raise ValueError(f"{label} must be a single path segment (no '/', '\\', NUL, '.', '..')")
    return value


def _json_ready(value: Any) -> bool:
    if value is None or isinstance(value, bool | str) or type(value) is int:
        return True
    return type(value) is float and math.isfinite(value)


def _needs_fit(value: Any) -> bool:
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _needs_fit(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_needs_fit(v) for v in value)
    return not _json_ready(value)


def _fit_key(key: Any, dropped: list[str]) -> str | None:
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or not isinstance(key, numbers.Real):
        dropped.append(f"key of type {type(key).__name__}")
        return None
    fitted = _json_fit(key, dropped)
    return None if fitted is _DROP else str(fitted)


def _fit_number(value: numbers.Real, dropped: list[str]) -> Any:
    if isinstance(value, numbers.Integral):
        return int(value)
    number = float(value)
    if math.isfinite(number):
        return number
    dropped.append(f"non-finite {type(value).__name__}")
    return _DROP


def _json_fit(value: Any, dropped: list[str]) -> Any:
    """``value`` as plain JSON data: numpy-like numbers converted, the unencodable dropped."""
    if _json_ready(value):
        return value
    if isinstance(value, numbers.Real):
        return _fit_number(value, dropped)
    if isinstance(value, dict):
        pairs = ((_fit_key(k, dropped), _json_fit(v, dropped)) for k, v in value.items())
        return {k: v for k, v in pairs if k is not None and v is not _DROP}
    if isinstance(value, list | tuple):
        return [f for item in value if (f := _json_fit(item, dropped)) is not _DROP]
    dropped.append(type(value).__name__)
    return _DROP


class RolloutSample(BaseModel):
    """The conversation a rollout produced, and its grade."""

    model_config: ClassVar[ConfigDict] = ConfigDict(allow_inf_nan=False, validate_assignment=True)

    id: str | None = None  # seed shape: the sample's name (agent or session name)
    messages: Sequence[SampleMessage] = Field(default_factory=list)
    trajectory_messages: Sequence[SampleMessage] | None = None
    label: str | None = None
    reward: float | None = None
    remove_sample: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra_fields: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _snapshot_trajectory(self) -> Self:
        # An explicit trajectory_messages=None disables trajectory archiving.
        if "trajectory_messages" not in self.model_fields_set:
            try:
                self.trajectory_messages = copy.deepcopy(list(self.messages))
            except Exception:
                logger.warning("could not snapshot messages for the trajectory", exc_info=True)
                self.trajectory_messages = None
        return self

    def json_safe_copy(self) -> Self:
        """A copy whose ``metrics``/``extra_fields`` encode as JSON (or ``self``, if they do)."""
        if not (_needs_fit(self.metrics) or _needs_fit(self.extra_fields)):
            return self
        dropped: list[str] = []
        fitted = self.model_copy(
            update={
                "metrics": _json_fit(self.metrics, dropped),
                "extra_fields": _json_fit(self.extra_fields, dropped),
            }
        )
        if dropped:
            logger.warning("dropped non-JSON sample values: %s", ", ".join(sorted(set(dropped))))
        return fitted


def _finite_timeout(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("timeout must be finite; omit it to run unbounded")
    return value


class ExecutionRequest(BaseModel):
    """What a backend executes: one dataset row, its deadlines, whether to grade."""

    id: str
    prompt: list[MessageDict]
    label: str | None = None
    metadata: dict[str, Any] | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    grade: bool = True

    _check_id = field_validator("id")(ensure_single_path_segment)
    _check_timeouts = field_validator("agent_timeout_sec", "grader_timeout_sec")(_finite_timeout)


class ExecutionResult(BaseModel):
    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None
    extra_fields: dict[str, Any] | None = None  # diagnostics; never on the wire
    # Seed-shape multi-sample rollouts: every named sample (``sample`` is the first).
    samples: dict[str, RolloutSample] = Field(default_factory=dict)


class ExecutionOutcome(BaseModel):
    """The workflow's result and, when grading ran, the grader's."""

    workflow: ExecutionResult
    grader: ExecutionResult | None = None

    @property
    def result(self) -> ExecutionResult:
        if self.workflow.status is not RolloutStatus.SUCCESS:
            if self.workflow.sample is None and self.grader is not None and self.grader.sample:
                return self.workflow.model_copy(update={"sample": self.grader.sample})
            return self.workflow
        return self.grader or self.workflow

    @property
    def result_to_save(self) -> ExecutionResult:
        """What the rollout's trajectory is archived from: the grader's result when it has a
        sample (it saw the whole conversation), else the workflow's."""
        if self.grader is not None and self.grader.sample is not None:
            return self.grader
        return self.workflow


__all__ = [
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "MessageDict",
    "RolloutErrorCategory",
    "RolloutSample",
    "RolloutStatus",
    "SampleMessage",
    "ensure_single_path_segment",
]
