"""The v2 protocol on the fleet: the record the gateway writes and the worker carries.

A v2 rollout is keyed by its ``rollout_id``. The worker runs the workflow and grader with the
SDK's own execution semantics (deadlines counting queue time, error categories, reward
stripping), reports ``grading`` as it starts grading, and stores the wire result the
trainer's long-poll returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping

from rollout_sdk.backend.execution import WorkflowBundle, execute_rollout
from rollout_sdk.context import RolloutContext, RolloutProgress
from rollout_sdk.server.rollout_server import cancelled_result
from rollout_sdk.types import (
    ExecutionResult,
    RolloutErrorCategory,
    RolloutInitRequest,
    RolloutResultResponse,
    RolloutStatus,
    wire_result,
)
from rollout_worker import metrics, tracing
from rollout_worker.execution import Lease, time_limit_message
from rollout_worker.records import Claim, Status, Verdict
from rollout_worker.secrets import SecretBox

logger = logging.getLogger(__name__)

PROTOCOL = "v2"


def admission_fields(request: RolloutInitRequest, box: SecretBox) -> dict[str, str]:
    """The record fields of a newly admitted v2 rollout; the LLM key is sealed, never plain."""
    fields = {
        "protocol": PROTOCOL,
        "rollout_id": request.rollout_id,
        "request": request.model_dump_json(exclude={"llm_api_key"}),
        **tracing.context_fields(),
    }
    if request.llm_api_key:
        fields["secret"] = box.seal(request.llm_api_key)
    return fields


def request_from_record(record: Mapping[str, str], box: SecretBox) -> RolloutInitRequest:
    request = RolloutInitRequest.model_validate_json(record["request"])
    if "secret" in record:
        request = request.model_copy(update={"llm_api_key": box.open(record["secret"])})
    return request


def failure_result(
    rollout_id: str,
    message: str = "rollout task crashed",
    category: RolloutErrorCategory = RolloutErrorCategory.INTERNAL_ERROR,
) -> RolloutResultResponse:
    return wire_result(
        rollout_id,
        ExecutionResult(status=RolloutStatus.FAILURE, err_message=message, err_category=category),
    )


class V2Carrier:
    """Runs v2 workflows (and graders) on this worker process."""

    def __init__(
        self, bundle: WorkflowBundle, box: SecretBox, retention_seconds: float, time_limit: float
    ) -> None:
        self.retention_ms = int(retention_seconds * 1000)
        self._bundle = bundle
        self._box = box
        self._time_limit = time_limit  # seconds on this worker; 0: none
        # The workflow config's max_concurrent applies per worker process.
        limit = bundle.max_concurrent
        self._slots = asyncio.Semaphore(limit) if limit else None

    async def carry(self, claim: Claim, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        if claim.verdict is Verdict.CANCELLED:
            return await self._record(lease, cancelled_result(request.rollout_id))
        if claim.verdict is Verdict.EXHAUSTED:
            message = f"rollout task crashed: {claim.attempt - 1} workers died running it"
            return await self._record(lease, failure_result(request.rollout_id, message))
        if claim.verdict is Verdict.ABANDONED:
            reason = claim.record["abandon_reason"]
            result = failure_result(request.rollout_id, reason, RolloutErrorCategory.AGENT_ERROR)
            return await self._record(lease, result)
        try:
            result, trajectory = await self._run(request, claim, lease)
        except asyncio.CancelledError:
            # Cancel requested, poll lease expired, or worker lease lost: only a rollout this
            # worker still holds can record the cancellation.
            return await self._record(lease, cancelled_result(request.rollout_id))
        return await self._record(lease, result, trajectory)

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._slots is None:
            yield
            return
        async with self._slots:
            yield

    async def _run(
        self, request: RolloutInitRequest, claim: Claim, lease: Lease
    ) -> tuple[RolloutResultResponse, str]:
        """The wire result, and for trajectory exports the sample's ``trajectory_messages`` as
        JSON when they differ from its messages (the wire never carries them; "" if none)."""

        async def report(status: RolloutStatus) -> None:
            if status is RolloutStatus.GRADING:
                await lease.advance(Status.GRADING)

        ctx = RolloutContext(
            chat_completions_url=request.chat_completions_url,
            api_key=request.llm_api_key,
            rollout_id=request.rollout_id,
            progress=RolloutProgress(status=RolloutStatus.RUNNING, on_status=report),
        )
        execution = request.execution_request()
        waiting_since = time.monotonic()
        async with self._slot():
            queued_sec = claim.ms_since_accepted / 1000 + (time.monotonic() - waiting_since)
            try:
                async with asyncio.timeout(self._time_limit or None):
                    outcome = await execute_rollout(
                        self._bundle, execution, ctx, queued_sec=queued_sec
                    )
            except TimeoutError:
                message = time_limit_message(self._time_limit)
                timed_out = RolloutErrorCategory.TIMEOUT
                return failure_result(request.rollout_id, message, timed_out), ""
            except Exception as exc:
                logger.exception(
                    "rollout %s: execution crashed outside user code", request.rollout_id
                )
                return failure_result(request.rollout_id, str(exc) or "rollout task crashed"), ""
        sample = outcome.result.sample
        trajectory = list(sample.trajectory_messages or []) if sample is not None else []
        differs = sample is not None and trajectory != list(sample.messages)
        kept = json.dumps(trajectory, default=str) if trajectory and differs else ""
        return wire_result(request.rollout_id, outcome.result), kept

    async def _record(
        self, lease: Lease, result: RolloutResultResponse, trajectory: str = ""
    ) -> Status | None:
        status = Status(result.status.value)
        fields = {"trajectory": trajectory} if trajectory else {}
        if not await lease.advance(status, result=result.wire_json(), **fields):
            return None
        category = result.err_category.value if result.err_category else None
        metrics.rollout_finished(PROTOCOL, status, category)
        return status


__all__ = ["PROTOCOL", "V2Carrier", "admission_fields", "failure_result", "request_from_record"]
