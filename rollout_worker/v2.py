"""The v2 carrier: runs the workflow and grader, and stores the wire result the trainer's
long-poll returns, with, for trajectory exports, the token ids and logprobs of each of its
chat calls (read from the TrainGate's answers by the SDK's transport: ``recording_turns``).

It runs them with the SDK's own execution semantics (deadlines counting queue time, error
categories, reward stripping) and reports ``grading`` as it starts grading. With
``OSMOSIS_ROLLOUT_OTLP_ENDPOINT`` set it also sends upstream's ownership logs for the
rollouts it runs (``rollout_sdk.server.ownership``): ``running`` as it starts one,
``grading``, and the status it stores. ``queued`` is not sent: a queued rollout has no
owning worker yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

from rollout_core.protocols.sealed import secret_of
from rollout_core.protocols.v2 import PROTOCOL, request_from_record
from rollout_core.secrets import SecretBox, redact
from rollout_core.store import Advance, Claim, Protocol, RecordField, Status, Verdict
from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.backend.execution import WorkflowBundle, execute_rollout
from rollout_sdk.backend.harbor.sandbox import SandboxOwner, current_owner
from rollout_sdk.client import Turn, TurnRecorder, recording_turns
from rollout_sdk.context import RolloutContext, RolloutProgress
from rollout_sdk.core.foreign import describe
from rollout_sdk.server.ownership import Fields, OwnershipLog
from rollout_sdk.types import (
    ExecutionOutcome,
    ExecutionRequest,
    RolloutErrorCategory,
    RolloutInitRequest,
    RolloutResultResponse,
    RolloutStatus,
    cancelled_result,
    failure_result,
    wire_result,
)
from rollout_worker import metrics
from rollout_worker.execution import Lease, Refusal, time_limit_message
from rollout_worker.result_budget import ResultBudget

logger = logging.getLogger(__name__)

# A grader done within this long is never reported as ``grading``: the status write, the
# long-polls it ends and the polls that follow would cost the fleet more than the grading
# took (a poll in between could have seen it only within this window).
GRADING_REPORT_DELAY_SECONDS = 0.05


class _GradingReport:
    """Writes ``grading`` once the grader has run for the delay; :meth:`settle` before the
    rollout's final write, so the two never cross."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._timer: asyncio.TimerHandle | None = None
        self._write: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(GRADING_REPORT_DELAY_SECONDS, self._begin)

    def _begin(self) -> None:
        self._write = asyncio.create_task(self._advance())

    async def _advance(self) -> None:
        try:
            await self._lease.advance(Status.GRADING)
        except Exception:  # the status is informative; the final write decides
            logger.warning("%s: could not record grading", self._lease.key, exc_info=True)

    async def settle(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._write is not None:
            await asyncio.shield(self._write)


# How a refused rollout fails on the wire (a cancelled one is cancelled, not failed).
REFUSAL_CATEGORIES = {
    Verdict.EXHAUSTED: RolloutErrorCategory.INTERNAL_ERROR,
    Verdict.ABANDONED: RolloutErrorCategory.AGENT_ERROR,
}


class V2Carrier:
    """Runs v2 workflows (and graders) on this worker process."""

    protocol: Protocol = PROTOCOL

    def __init__(
        self,
        agent: WorkflowBundle | ExecutionBackend | None,  # None: only refuses v2 rollouts
        box: SecretBox,
        retention_seconds: float,
        time_limit: float,
        token_ids: bool,
        ownership: OwnershipLog,
        *,
        fleet: str,
        budget: ResultBudget,
    ) -> None:
        self._budget = budget
        self.retention_seconds = retention_seconds
        self._ownership = ownership
        # A backend (HarborBackend) runs each rollout its own way and limits itself.
        self._backend = agent if isinstance(agent, ExecutionBackend) else None
        self._bundle = agent if isinstance(agent, WorkflowBundle) else None
        self._token_ids = token_ids
        self._box = box
        self._fleet = fleet  # the key prefix: sandboxes are labelled with it
        self._time_limit = time_limit  # seconds on this worker; 0: none
        # The workflow config's max_concurrent applies per worker process.
        limit = self._bundle.max_concurrent if self._bundle is not None else None
        self._slots = asyncio.Semaphore(limit) if limit else None

    def secret(self, claim: Claim) -> str | None:
        return secret_of(claim.record, self._box)

    async def carry(self, claim: Claim, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        owned = self._ownership.fields(request.rollout_id, request.metadata)
        self._ownership.record(owned, RolloutStatus.RUNNING)
        with self._recording() as recorder:
            try:
                result, trajectory = await self._run(request, claim, lease, owned)
            except asyncio.CancelledError:
                # Cancel requested, polling lease expired, or worker lease lost: only a rollout
                # this worker still holds can record the cancellation.
                result, trajectory = cancelled_result(request.rollout_id), ""
        if result.err_message and request.llm_api_key:
            # An agent's exception may quote the trainer's key: never stored nor returned.
            shown = redact(result.err_message, request.llm_api_key)
            result = result.model_copy(update={"err_message": shown})
        return await self._record(lease, owned, result, trajectory, recorder.turns)

    def _recording(self) -> contextlib.AbstractContextManager[TurnRecorder]:
        """Keeps the token ids and logprobs of the rollout's chat calls (ROLLOUT_FLEET_TOKEN_IDS),
        or, off, nothing: its calls are neither asked for them nor read."""
        return recording_turns() if self._token_ids else contextlib.nullcontext(TurnRecorder())

    async def refuse(self, claim: Claim, refusal: Refusal, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        rollout_id = request.rollout_id
        owned = self._ownership.fields(rollout_id, request.metadata)
        category = REFUSAL_CATEGORIES.get(refusal.verdict)
        if category is None:
            return await self._record(lease, owned, cancelled_result(rollout_id))
        failed = failure_result(rollout_id, refusal.message, category)
        return await self._record(lease, owned, failed)

    async def fail(self, claim: Claim, message: str, lease: Lease) -> Status | None:
        rollout_id = claim.record.rollout_id
        failed = failure_result(rollout_id, message, RolloutErrorCategory.INTERNAL_ERROR)
        return await self._record(lease, self._ownership.fields(rollout_id, None), failed)

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._slots is None:
            yield
            return
        async with self._slots:
            yield

    async def _run(
        self, request: RolloutInitRequest, claim: Claim, lease: Lease, owned: Fields | None
    ) -> tuple[RolloutResultResponse, str]:
        """The wire result, and for trajectory exports the sample's ``trajectory_messages`` as
        JSON when they differ from its messages (the wire never carries them; "" if none)."""

        grading = _GradingReport(lease)

        async def report(status: RolloutStatus) -> None:
            if status is RolloutStatus.GRADING:
                self._ownership.record(owned, status)
                grading.start()

        ctx = RolloutContext(
            chat_completions_url=request.chat_completions_url,
            api_key=request.llm_api_key,
            rollout_id=request.rollout_id,
            progress=RolloutProgress(status=RolloutStatus.RUNNING, on_status=report),
        )
        execution = request.execution_request()
        waiting_since = time.monotonic()
        async with self._slot():
            queued_sec = claim.since_accepted + (time.monotonic() - waiting_since)
            try:
                async with asyncio.timeout(self._time_limit or None):
                    try:
                        if self._backend is not None:
                            owner = SandboxOwner(
                                self._fleet, lease.key, request.rollout_id, lease.execution
                            )
                            outcome = await self._on_backend(self._backend, execution, ctx, owner)
                        else:
                            assert self._bundle is not None, "a v2 rollout reached a v1 worker"
                            outcome = await execute_rollout(
                                self._bundle, execution, ctx, queued_sec=queued_sec
                            )
                    finally:
                        await grading.settle()
            except TimeoutError:
                message = time_limit_message(self._time_limit)
                timed_out = RolloutErrorCategory.TIMEOUT
                return failure_result(request.rollout_id, message, timed_out), ""
            except Exception as exc:
                logger.exception(
                    "rollout %s: execution crashed outside user code", request.rollout_id
                )
                return failure_result(request.rollout_id, describe(exc)), ""
        sample = outcome.result.sample
        trajectory = list(sample.trajectory_messages or []) if sample is not None else []
        differs = sample is not None and trajectory != list(sample.messages)
        kept = json.dumps(trajectory, default=str) if trajectory and differs else ""
        return wire_result(request.rollout_id, outcome.result), kept

    @staticmethod
    async def _on_backend(
        backend: ExecutionBackend,
        execution: ExecutionRequest,
        ctx: RolloutContext,
        owner: SandboxOwner,
    ) -> ExecutionOutcome:
        """One rollout on the agent's own backend, its sandbox labelled for this execution."""
        token = current_owner.set(owner)
        try:
            with ctx:
                return await backend.execute(execution)
        finally:
            current_owner.reset(token)

    async def _record(
        self,
        lease: Lease,
        owned: Fields | None,
        result: RolloutResultResponse,
        trajectory: str = "",
        turns: list[Turn] | None = None,
    ) -> Status | None:
        wire = result.wire_json()
        turns_json = json.dumps(turns) if turns else ""
        if (over := self._budget.over(wire, trajectory, turns_json)) is not None:
            logger.warning("rollout %s: %s", result.rollout_id, over)
            result = failure_result(result.rollout_id, over, RolloutErrorCategory.VALIDATION_ERROR)
            wire, trajectory, turns_json = result.wire_json(), "", ""
        status = Status(result.status.value)
        fields = {RecordField.TRAJECTORY: trajectory} if trajectory else {}
        if turns_json:
            fields[RecordField.TURNS] = turns_json
        # A success that comes after a cancel request is stored as cancelled (PROTOCOL.md §2.5).
        cancelled = cancelled_result(result.rollout_id)
        advanced = await lease.advance(
            status,
            result=wire,
            cancelled_result=cancelled.wire_json(),
            fields=fields,
        )
        if advanced is Advance.LOST:
            return None
        if advanced is Advance.CANCELLED:
            result, status = cancelled, Status.CANCELLED
        self._ownership.record(owned, result.status)
        category = result.err_category.value if result.err_category else None
        metrics.rollout_finished(PROTOCOL, status, category)
        return status


__all__ = ["V2Carrier"]
