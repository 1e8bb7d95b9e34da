"""The v1 carrier: runs the agent loop and delivers its completion callback.

The completion body is stored (status ``delivering``) before it is posted, so a worker that
dies mid-delivery leaves a result another worker delivers instead of a rollout the trainer
never hears about. A started delivery is seen through: neither a cancel nor a lost lease
interrupts a POST in flight (the trainer may be reading it), and every callback of a rollout
carries the same ``Idempotency-Key`` (its idempotency key) so a receiver can drop a repeat.
A repeat happens only when a worker dies between the POST and the write that records it
(docs/RELIABILITY.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from rollout_core.protocols.v1 import PROTOCOL, request_from_record
from rollout_core.secrets import SecretBox, redact
from rollout_core.store import Advance, Claim, Protocol, RecordField, Status, Verdict
from rollout_sdk.client import HttpClientShards, OsmosisLLMClient, Turn
from rollout_sdk.config import RolloutSettings
from rollout_sdk.core.base import RolloutAgentLoop, RolloutContext
from rollout_sdk.core.exceptions import (
    OsmosisRolloutError,
    OsmosisServerError,
    OsmosisTimeoutError,
    OsmosisValidationError,
    RefusedDestinationError,
)
from rollout_sdk.core.schemas import RolloutRequest, RolloutResponse, RolloutStatus
from rollout_sdk.runner import error_response, run_agent_loop
from rollout_worker import metrics
from rollout_worker.execution import CANCELLED, Lease, Refusal, time_limit_message

logger = logging.getLogger(__name__)

AGENT_ERROR = "agent_error"  # v1 results carry no error category; a failed one is the agent's
NOT_DELIVERED = "not delivered: "


def delivery_failure(exc: OsmosisRolloutError) -> str:
    """What the record says about a failed callback: the status or the kind of failure, never
    the receiver's answer (a foreign endpoint's body must not be stored or returned)."""
    if isinstance(exc, OsmosisValidationError | OsmosisServerError):
        return f"failed: the trainer answered HTTP {exc.status_code}"
    if isinstance(exc, RefusedDestinationError):  # our own words, never the receiver's
        return f"failed: {exc}"
    if isinstance(exc, OsmosisTimeoutError):
        return "failed: the trainer did not answer in time"
    return "failed: the trainer could not be reached"


def terminal_status(response: RolloutResponse) -> Status:
    return Status.SUCCESS if response.status is RolloutStatus.COMPLETED else Status.FAILURE


class V1Carrier:
    """Runs v1 agent loops and delivers their completion callbacks."""

    protocol: Protocol = PROTOCOL

    def __init__(
        self,
        agent_loop: RolloutAgentLoop | None,  # None: this worker only refuses v1 rollouts
        http: HttpClientShards,
        box: SecretBox,
        sdk_settings: RolloutSettings,
        retention_seconds: float,
        time_limit: float,
        debug_dir: str | None = None,
    ) -> None:
        self.retention_seconds = retention_seconds
        self._time_limit = time_limit  # seconds on this worker; 0: none
        self._agent_loop = agent_loop
        self._http = http
        self._box = box
        self._sdk_settings = sdk_settings
        self._debug_dir = debug_dir

    def _client(self, request: RolloutRequest) -> OsmosisLLMClient:
        return OsmosisLLMClient(
            request.server_url,
            request.rollout_id,
            request.api_key,
            settings=self._sdk_settings,
            http_client=self._http.for_rollout(request.rollout_id),
        )

    async def carry(self, claim: Claim, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        if claim.verdict is Verdict.DELIVERING:  # a worker died delivering it: deliver again
            stored = RolloutResponse.model_validate_json(claim.record.result or "")
            return await self._deliver_stored(lease, request, stored)
        response, turns = await self._run(claim, request)
        return await self._deliver(lease, request, response, turns)

    async def refuse(self, claim: Claim, refusal: Refusal, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        if claim.verdict is Verdict.DELIVERING:  # its result exists: never replaced
            return await self.carry(claim, lease)
        response = error_response(request.rollout_id, refusal.message)
        return await self._deliver(lease, request, response)

    async def fail(self, claim: Claim, message: str, lease: Lease) -> Status | None:
        response = error_response(claim.record.rollout_id, message)
        delivery = NOT_DELIVERED + "the record cannot be read"
        fields = {RecordField.DELIVERY: delivery}
        advanced = await lease.advance(Status.FAILURE, result=response.wire_json(), fields=fields)
        return None if advanced is Advance.LOST else Status.FAILURE

    async def _run(
        self, claim: Claim, request: RolloutRequest
    ) -> tuple[RolloutResponse, list[Turn]]:
        """Run the agent (the trainer hears back whatever happens); with what each of its LLM
        calls returned besides the message."""
        assert self._agent_loop is not None, "a v1 rollout reached a worker without a v1 agent"
        tools: list[Any] = json.loads(claim.record.response or "{}")["tools"]
        client = self._client(request)
        ctx = RolloutContext(
            request,
            tools,
            client,
            # total_latency_ms counts from admission, queue time included (P§1.6).
            _start_time=time.monotonic() - claim.since_accepted,
            _debug_dir=self._debug_dir,
        )
        try:
            async with asyncio.timeout(self._time_limit or None):
                response = await run_agent_loop(self._agent_loop, ctx)
        except TimeoutError:  # ours: run_agent_loop turns the agent's own errors into results
            message = time_limit_message(self._time_limit)
            response = error_response(request.rollout_id, message, ctx)
        except asyncio.CancelledError:
            # Cancelled by an operator (Flower's Revoke) or because the lease was lost; in the
            # latter case storing this result fails and another worker owns the rollout.
            response = error_response(request.rollout_id, CANCELLED, ctx)
        return response, client.turns()

    async def _deliver(
        self,
        lease: Lease,
        request: RolloutRequest,
        response: RolloutResponse,
        turns: list[Turn] | None = None,
    ) -> Status | None:
        """Store the completion body, then post it. If the rollout's cancellation was requested
        meanwhile, the cancelled response is stored and posted instead (never a success)."""
        fields = {RecordField.TURNS: json.dumps(turns or [])}
        cancelled = error_response(request.rollout_id, CANCELLED)
        advanced = await lease.advance(
            Status.DELIVERING,
            result=response.wire_json(),
            cancelled_result=cancelled.wire_json(),
            fields=fields,
        )
        if advanced is Advance.LOST:
            return None
        if advanced is Advance.CANCELLED:
            response = cancelled
        return await self._deliver_stored(lease, request, response)

    async def _deliver_stored(
        self, lease: Lease, request: RolloutRequest, response: RolloutResponse
    ) -> Status | None:
        """Post and record the outcome, shielded: a cancel (an operator's, or the lease's)
        waits for the delivery instead of cutting a POST the trainer may be reading."""
        delivery = asyncio.ensure_future(self._post_and_record(lease, request, response))
        task = asyncio.current_task()
        while True:
            try:
                return await asyncio.shield(delivery)
            except asyncio.CancelledError:
                if delivery.cancelled():
                    raise
                if task is not None:
                    task.uncancel()  # seen through first; the outcome says what happened
                logger.info("rollout %s: cancel waits for its delivery", request.rollout_id)

    async def _post_and_record(
        self, lease: Lease, request: RolloutRequest, response: RolloutResponse
    ) -> Status | None:
        delivery = await self._post(request, response)
        status = terminal_status(response)
        advanced = await lease.advance(status, fields={RecordField.DELIVERY: delivery})
        if advanced is Advance.LOST:
            return None
        metrics.rollout_finished(
            PROTOCOL, status, None if status is Status.SUCCESS else AGENT_ERROR
        )
        return status

    async def _post(self, request: RolloutRequest, response: RolloutResponse) -> str:
        try:
            await self._client(request).post_completion(
                response, idempotency_key=request.idempotency_token
            )
        except OsmosisRolloutError as exc:
            reason = redact(str(exc), request.api_key)
            logger.warning(
                "rollout %s: completion callback not delivered: %s", request.rollout_id, reason
            )
            metrics.CALLBACKS.labels("failed").inc()
            return delivery_failure(exc)
        metrics.CALLBACKS.labels("delivered").inc()
        return "delivered"


__all__ = ["V1Carrier"]
