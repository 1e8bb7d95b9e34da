"""v2 (poll/lease) wire models (PROTOCOL.md §2)."""

from __future__ import annotations

import logging
import math
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, Field, field_validator, model_validator

from rollout_sdk.types.sample import (
    ExecutionRequest,
    ExecutionResult,
    MessageDict,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
    _finite_timeout,
    ensure_single_path_segment,
)
from rollout_sdk.utils import ensure_bearer_token

logger = logging.getLogger(__name__)

POLLING_LEASE_HEADER = "X-Osmosis-Rollout-Lease"
SAMPLES_EXTRA_FIELD = "osmosis_samples"
_NOT_ON_THE_WIRE = {"trajectory_messages", "id"}
DEFAULT_RESULT_WAIT_TIMEOUT_SEC = 30.0
DEFAULT_POLLING_LEASE_TIMEOUT_SEC = 120.0
DEFAULT_RESULT_RETENTION_SEC = 900.0
# [decision] P§2.3: a rollout id holds at most this many bytes of UTF-8, a file name's limit
# (each rollout's artifacts directory is named by it, S§2.14). Percent-encoded in a poll's
# path or an LLM call's header (P§2.11) it takes at most three times as many: far from any
# HTTP server's limit on a request line (above about 64 KB an id was admitted and could
# never be polled).
MAX_ROLLOUT_ID_BYTES = 255


def _check_id_size(value: str) -> str:
    try:
        size = len(value.encode())
    except UnicodeEncodeError as exc:
        raise ValueError("rollout_id must be text UTF-8 can carry (no lone surrogates)") from exc
    if size > MAX_ROLLOUT_ID_BYTES:
        raise ValueError(
            f"rollout_id must be at most {MAX_ROLLOUT_ID_BYTES} bytes of UTF-8; this one has {size}"
        )
    return value


class RolloutInitRequest(BaseModel):
    """Body of ``POST /rollout``. Unknown fields (e.g. v2-cb callback URLs) are ignored."""

    # The pattern and length only document the checks below (clients and fuzzers read the
    # schema); the limit is in bytes of UTF-8, so a character counts 1 to 4 of it.
    rollout_id: str = Field(
        json_schema_extra={
            "pattern": "^(?!\\.{1,2}$)[^/\\\\\\x00]+$",
            "maxLength": MAX_ROLLOUT_ID_BYTES,
            "description": f"at most {MAX_ROLLOUT_ID_BYTES} bytes of UTF-8",
        }
    )
    initial_messages: list[MessageDict]
    chat_completions_url: str
    llm_api_key: str | None = Field(default=None, repr=False)
    label: str | None = None
    metadata: dict[str, Any] | None = None
    grade: bool = True
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    extra_fields: dict[str, Any] | None = None

    _check_id = field_validator("rollout_id")(ensure_single_path_segment)
    _check_id_size = field_validator("rollout_id")(_check_id_size)
    _check_timeouts = field_validator("agent_timeout_sec", "grader_timeout_sec")(_finite_timeout)

    @field_validator("llm_api_key")
    @classmethod
    def _check_llm_api_key(cls, value: str | None) -> str | None:
        if value == "":
            raise ValueError("llm_api_key must be omitted or a non-empty string")
        return ensure_bearer_token(value, label="llm_api_key")

    def execution_request(self) -> ExecutionRequest:
        """What a backend executes for this admission."""
        return ExecutionRequest(
            id=self.rollout_id,
            prompt=self.initial_messages,
            label=self.label,
            metadata=self.metadata,
            agent_timeout_sec=self.agent_timeout_sec,
            grader_timeout_sec=self.grader_timeout_sec,
            grade=self.grade,
        )


class RolloutInitResponse(BaseModel):
    """202 body of ``POST /rollout``."""

    rollout_id: str
    status: RolloutStatus
    polling_lease_token: str = Field(min_length=1)
    result_wait_timeout_sec: float
    polling_lease_timeout_sec: float

    @model_validator(mode="after")
    def _check_timeouts(self) -> Self:
        wait, lease = self.result_wait_timeout_sec, self.polling_lease_timeout_sec
        if not math.isfinite(wait) or wait <= 0:
            raise ValueError("result_wait_timeout_sec must be positive and finite")
        if not math.isfinite(lease) or lease <= wait:
            raise ValueError("polling_lease_timeout_sec must be finite and exceed the wait")
        return self


class RolloutResultResponse(BaseModel):
    """Body of ``GET /rollout/{id}/result``: the status, and once finished the outcome."""

    rollout_id: str
    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None

    def wire_json(self) -> str:
        """All five keys, nulls included; never ``trajectory_messages`` (P§2.4)."""
        return self.model_dump_json(exclude={"sample": _NOT_ON_THE_WIRE})


def _utf8(text: str | None) -> str | None:
    return text.encode("utf-8", errors="replace").decode() if text is not None else None


def _trainable(sample: RolloutSample, succeeded: bool) -> RolloutSample:
    """A failed or removed sample never carries a trainable reward on the wire (P§2.10)."""
    if succeeded and not sample.remove_sample:
        return sample
    return sample.model_copy(update={"reward": None})


def _wire_sample(result: ExecutionResult) -> RolloutSample | None:
    if result.sample is None:
        return None
    succeeded = result.status is RolloutStatus.SUCCESS
    sample = _trainable(result.sample, succeeded).json_safe_copy()
    if len(result.samples) > 1:
        # [decision] seed multi-sample rollouts: none is dropped; all ride in extra_fields.
        everything = {
            name: _trainable(s, succeeded)
            .json_safe_copy()
            .model_dump(mode="json", exclude=_NOT_ON_THE_WIRE)
            for name, s in result.samples.items()
        }
        sample = sample.model_copy(
            update={"extra_fields": {**sample.extra_fields, SAMPLES_EXTRA_FIELD: everything}}
        )
    try:
        sample.model_dump_json(exclude=_NOT_ON_THE_WIRE)
    except (TypeError, ValueError, RecursionError):
        logger.warning("a sample cannot be encoded; sending its reward only", exc_info=True)
        sample = RolloutSample(
            label=_utf8(sample.label),
            reward=sample.reward,
            remove_sample=sample.remove_sample,
            trajectory_messages=None,
        )
    return sample


def wire_result(rollout_id: str, result: ExecutionResult) -> RolloutResultResponse:
    """The result a trainer receives for an execution result."""
    return RolloutResultResponse(
        rollout_id=rollout_id,
        status=result.status,
        sample=_wire_sample(result),
        err_message=_utf8(result.err_message),
        err_category=result.err_category,
    )


def failure_result(
    rollout_id: str,
    message: str,
    category: RolloutErrorCategory = RolloutErrorCategory.INTERNAL_ERROR,
) -> RolloutResultResponse:
    """The result of a rollout that failed outside the workflow and grader (no sample)."""
    return RolloutResultResponse(
        rollout_id=rollout_id,
        status=RolloutStatus.FAILURE,
        err_message=_utf8(message),
        err_category=category,
    )


def lease_expired_result(rollout_id: str) -> RolloutResultResponse:
    """The result of a rollout nobody polled in time (P§2.7)."""
    return failure_result(rollout_id, "polling lease expired", RolloutErrorCategory.LEASE_EXPIRED)


def cancelled_result(rollout_id: str) -> RolloutResultResponse:
    """The result of a cancelled rollout (P§2.5)."""
    return RolloutResultResponse(
        rollout_id=rollout_id, status=RolloutStatus.CANCELLED, err_message="cancelled"
    )


class CancelDisposition(StrEnum):
    """What ``POST /rollout/cancel`` reports for each selected id (P§2.5)."""

    CANCELLED_QUEUED = "cancelled_queued"
    CANCELLED_RUNNING = "cancelled_running"
    NOT_FOUND = "not_found"  # unknown, or finished already


class CancelRolloutsRequest(BaseModel):
    """Exactly one selector: ``ids`` (``[]`` counts), ``prefix``, or ``all``."""

    ids: list[str] | None = None
    prefix: str | None = None
    all: bool = False

    @property
    def selector_count(self) -> int:
        return sum([self.ids is not None, self.prefix is not None, self.all])


class CancelRolloutsResponse(BaseModel):
    dispositions: dict[str, CancelDisposition]


class RolloutLifecycle(BaseModel):
    accepting_rollouts: bool
    active_rollouts: int = Field(ge=0)


class HealthConcurrency(BaseModel):
    max_concurrent: int | None
    queued: int
    running: int


class RolloutServerHealth(BaseModel):
    """Body of v2 ``GET /health``: backend keys plus the server's identity and lifecycle."""

    status: str = "ok"
    concurrency: HealthConcurrency
    instance_id: str
    process_id: str
    lifecycle: RolloutLifecycle


class DrainRequest(BaseModel):
    timeout_sec: float = Field(30.0, ge=0, allow_inf_nan=False)


class DrainResponse(BaseModel):
    drained: bool
    accepting_rollouts: bool
    active_rollouts: int
    process_id: str
    rollout_ids: list[str]


__all__ = [
    "DEFAULT_POLLING_LEASE_TIMEOUT_SEC",
    "DEFAULT_RESULT_RETENTION_SEC",
    "DEFAULT_RESULT_WAIT_TIMEOUT_SEC",
    "MAX_ROLLOUT_ID_BYTES",
    "POLLING_LEASE_HEADER",
    "SAMPLES_EXTRA_FIELD",
    "CancelDisposition",
    "CancelRolloutsRequest",
    "CancelRolloutsResponse",
    "DrainRequest",
    "DrainResponse",
    "HealthConcurrency",
    "RolloutInitRequest",
    "RolloutInitResponse",
    "RolloutLifecycle",
    "RolloutResultResponse",
    "RolloutServerHealth",
    "cancelled_result",
    "failure_result",
    "lease_expired_result",
    "wire_result",
]
