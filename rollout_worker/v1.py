"""The v1 protocol on the fleet: the record the gateway writes and the worker carries.

A v1 rollout is keyed by its idempotency key (``idempotency_key or rollout_id``, P§1.3.1).
The worker runs the agent loop, stores the completion body (status ``delivering``) and only
then posts it, so a worker that dies mid-delivery leaves a result another worker delivers
instead of a rollout the trainer never hears about.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from rollout_sdk.client import HttpClientShards, OsmosisLLMClient
from rollout_sdk.config import RolloutSettings
from rollout_sdk.core.base import RolloutAgentLoop, RolloutContext
from rollout_sdk.core.exceptions import OsmosisRolloutError
from rollout_sdk.core.schemas import RolloutRequest, RolloutResponse, RolloutStatus
from rollout_sdk.runner import error_response, run_agent_loop
from rollout_worker import metrics, tracing
from rollout_worker.execution import Lease, time_limit_message
from rollout_worker.records import Claim, Status, Verdict
from rollout_worker.secrets import SecretBox, redact

logger = logging.getLogger(__name__)

PROTOCOL = "v1"
AGENT_ERROR = "agent_error"  # v1 results carry no error category; a failed one is the agent's
CANCELLED_MESSAGE = "rollout cancelled before it finished"


def admission_fields(request: RolloutRequest, response_json: str, box: SecretBox) -> dict[str, str]:
    """The record fields of a newly admitted v1 rollout; the API key is sealed, never plain."""
    fields = {
        "protocol": PROTOCOL,
        "rollout_id": request.rollout_id,
        "request": request.model_dump_json(exclude={"api_key"}),
        "response": response_json,
        **tracing.context_fields(),
    }
    if request.api_key:
        fields["secret"] = box.seal(request.api_key)
    return fields


def request_from_record(record: Mapping[str, str], box: SecretBox) -> RolloutRequest:
    request = RolloutRequest.model_validate_json(record["request"], context={"admitted": True})
    if "secret" in record:
        request = request.model_copy(update={"api_key": box.open(record["secret"])})
    return request


def terminal_status(response: RolloutResponse) -> Status:
    return Status.SUCCESS if response.status is RolloutStatus.COMPLETED else Status.FAILURE


class V1Carrier:
    """Runs v1 agent loops and delivers their completion callbacks."""

    def __init__(
        self,
        agent_loop: RolloutAgentLoop,
        http: HttpClientShards,
        box: SecretBox,
        sdk_settings: RolloutSettings,
        retention_seconds: float,
        time_limit: float,
        debug_dir: str | None = None,
    ) -> None:
        self.retention_ms = int(retention_seconds * 1000)
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
        if claim.verdict is Verdict.DELIVERING:
            response = RolloutResponse.model_validate_json(claim.record["result"])
        else:
            response, turns = await self._produce(claim, request)
            stored = await lease.advance(
                Status.DELIVERING, result=response.wire_json(), turns=json.dumps(turns)
            )
            if not stored:
                return None
        delivery = await self._deliver(request, response)
        status = terminal_status(response)
        if not await lease.advance(status, delivery=delivery):
            return None
        metrics.rollout_finished(
            PROTOCOL, status, None if status is Status.SUCCESS else AGENT_ERROR
        )
        return status

    async def _produce(
        self, claim: Claim, request: RolloutRequest
    ) -> tuple[RolloutResponse, list[dict[str, Any]]]:
        """Run the agent, or explain why it did not run (the trainer hears back either way);
        with what each of its LLM calls returned besides the message."""
        if claim.verdict is Verdict.CANCELLED:
            return error_response(request.rollout_id, CANCELLED_MESSAGE), []
        if claim.verdict is Verdict.EXHAUSTED:
            message = (
                f"rollout abandoned after {claim.attempt - 1} attempts: the workers running it "
                "stopped (crashed or were killed) each time"
            )
            return error_response(request.rollout_id, message), []
        if claim.verdict is Verdict.ABANDONED:
            return error_response(request.rollout_id, claim.record["abandon_reason"]), []
        tools: list[Any] = json.loads(claim.record["response"])["tools"]
        client = self._client(request)
        ctx = RolloutContext(
            request,
            tools,
            client,
            # total_latency_ms counts from admission, queue time included (P§1.6).
            _start_time=time.monotonic() - claim.ms_since_accepted / 1000,
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
            response = error_response(request.rollout_id, CANCELLED_MESSAGE, ctx)
        return response, client.turns()

    async def _deliver(self, request: RolloutRequest, response: RolloutResponse) -> str:
        try:
            await self._client(request).post_completion(response)
        except OsmosisRolloutError as exc:
            reason = redact(str(exc), request.api_key)
            logger.warning(
                "rollout %s: completion callback not delivered: %s", request.rollout_id, reason
            )
            metrics.CALLBACKS.labels("failed").inc()
            return f"failed: {reason}"
        metrics.CALLBACKS.labels("delivered").inc()
        return "delivered"


__all__ = ["PROTOCOL", "V1Carrier", "admission_fields", "request_from_record"]
