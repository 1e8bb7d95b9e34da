"""The v1 carrier: runs the agent loop, then hands its completion body to the callback's
delivery (``rollout_worker/delivery.py``: stored first, posted while the lease holds, the
trainer's answer recorded).

A rollout the worker cannot carry (its record cannot be read: the API key does not open, the
request does not parse; or the worker faulted on it) still ends with one ERROR callback
saying why, sent without ``Authorization`` (the key is what may not be readable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any
from urllib.parse import urlsplit

from rollout_core.protocols.sealed import secret_of
from rollout_core.protocols.v1 import PROTOCOL, request_from_record
from rollout_core.secrets import SecretBox, redact
from rollout_core.store import (
    Advance,
    Claim,
    Protocol,
    RecordField,
    RolloutRecord,
    Status,
    Verdict,
)
from rollout_sdk.client import HttpClientShards, OsmosisLLMClient, Turn
from rollout_sdk.config import RolloutSettings
from rollout_sdk.core.base import RolloutAgentLoop, RolloutContext
from rollout_sdk.core.schemas import RolloutRequest, RolloutResponse
from rollout_sdk.runner import error_response, run_agent_loop
from rollout_worker.delivery import (
    Callback,
    CallbackDelivery,
    ended_on_the_wire,
    terminal_status,
)
from rollout_worker.execution import CANCELLED, Lease, Refusal, time_limit_message
from rollout_worker.result_budget import ResultBudget

logger = logging.getLogger(__name__)

NOT_DELIVERED = "not delivered: "
# A request whose JSON no longer parses at all may still name its callback URL.
_SERVER_URL = re.compile(r'"server_url"\s*:\s*"([^"\\]+)"')


def unreadable_callback_url(record: RolloutRecord) -> str | None:
    """The callback URL of a record whose request cannot be read whole: the ``server_url``
    its stored JSON still names, if it is an http(s) URL with a host; else ``None``."""
    text = record.request or ""
    try:
        stored = json.loads(text)
    except ValueError:  # mangled or cut short: the field may still be there
        found = _SERVER_URL.search(text)
        url: object = found.group(1) if found else None
    else:
        url = stored.get("server_url") if isinstance(stored, dict) else None
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return url if parts.scheme in ("http", "https") and parts.hostname else None


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
        debug_dir: str | None,
        budget: ResultBudget,
    ) -> None:
        self.retention_seconds = retention_seconds
        self._time_limit = time_limit  # seconds on this worker; 0: none
        self._agent_loop = agent_loop
        self._http = http
        self._box = box
        self._sdk_settings = sdk_settings
        self._debug_dir = debug_dir
        self._delivery = CallbackDelivery(self._client, budget)

    def _client(self, to: Callback) -> OsmosisLLMClient:
        return OsmosisLLMClient(
            to.server_url,
            to.rollout_id,
            to.api_key,
            settings=self._sdk_settings,
            http_client=self._http.for_rollout(to.rollout_id),
        )

    def secret(self, claim: Claim) -> str | None:
        return secret_of(claim.record, self._box)

    async def carry(self, claim: Claim, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        to = Callback.of(request)
        if claim.verdict is Verdict.DELIVERING:  # a worker died delivering it: deliver again
            stored = RolloutResponse.model_validate_json(claim.record.result or "")
            return await self._delivery.post_stored(claim, lease, to, stored)
        response, turns = await self._run(claim, request)
        return await self._delivery.store_and_post(claim, lease, to, response, turns)

    async def refuse(self, claim: Claim, refusal: Refusal, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        if claim.verdict is Verdict.DELIVERING:  # its result exists: never replaced
            return await self.carry(claim, lease)
        if claim.record.status is Status.DELIVERING:  # exhausted delivering: ends undelivered
            return await self._give_up_delivery(claim, lease)
        response = error_response(request.rollout_id, refusal.message)
        return await self._delivery.store_and_post(claim, lease, Callback.of(request), response)

    async def _give_up_delivery(self, claim: Claim, lease: Lease) -> Status | None:
        """Every worker that took this stored result to deliver stopped before it recorded the
        outcome: it ends with that result, not posted again."""
        stored = RolloutResponse.model_validate_json(claim.record.result or "")
        status = terminal_status(stored)
        tries = claim.record.deliveries  # the first, and each takeover but this one
        delivery = (
            f"{NOT_DELIVERED}{tries} {'try' if tries == 1 else 'tries'}, each ended by its "
            "worker stopping (crashed or killed) before the trainer's answer was recorded; "
            "the trainer may have received it"
        )
        advanced = await lease.advance(status, fields={RecordField.DELIVERY: delivery})
        return None if advanced is Advance.LOST else status

    async def fail(self, claim: Claim, message: str, lease: Lease) -> Status | None:
        """End a rollout this worker cannot carry with one ERROR callback saying why, sent
        without ``Authorization`` (its key may be what cannot be read). A stored result is
        posted instead, as a takeover would; a callback this execution already put on the
        wire is never posted again."""
        rollout_id = claim.record.rollout_id
        if lease.posted:  # the fault came after its callback went out
            return await self._end_after_fault(lease, message)
        if claim.record.status is Status.DELIVERING and claim.verdict is not Verdict.DELIVERING:
            return await self._give_up_delivery(claim, lease)  # its takeovers are spent
        url = unreadable_callback_url(claim.record)
        response = error_response(rollout_id, message)
        if url is None:
            delivery = f"{NOT_DELIVERED}the record names no callback URL that can be read"
            fields = {RecordField.DELIVERY: delivery}
            advanced = await lease.advance(
                Status.FAILURE, result=response.wire_json(), fields=fields
            )
            return None if advanced is Advance.LOST else Status.FAILURE
        to = Callback(url, rollout_id, None)
        if claim.verdict is Verdict.DELIVERING:
            stored = _stored_response(claim.record)
            if stored is not None:
                return await self._delivery.post_stored(claim, lease, to, stored)
        return await self._delivery.store_and_post(claim, lease, to, response)

    async def _end_after_fault(self, lease: Lease, message: str) -> Status | None:
        """The worker faulted after this execution's callback went out: the rollout ends with
        the stored result's status, not posted again."""
        stored = _stored_response(await lease.store.load(lease.key, RecordField.RESULT))
        status = Status.FAILURE if stored is None else terminal_status(stored)
        delivery = ended_on_the_wire(message, max(lease.attempts_out, 1))
        advanced = await lease.advance(status, fields={RecordField.DELIVERY: delivery})
        return None if advanced is Advance.LOST else status

    async def _run(
        self, claim: Claim, request: RolloutRequest
    ) -> tuple[RolloutResponse, list[Turn]]:
        """Run the agent (the trainer hears back whatever happens); with what each of its LLM
        calls returned besides the message."""
        assert self._agent_loop is not None, "a v1 rollout reached a worker without a v1 agent"
        tools: list[Any] = json.loads(claim.record.response or "{}")["tools"]
        client = self._client(Callback.of(request))
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
        if response.error_message and request.api_key:
            # An agent's exception may quote the trainer's key: never stored nor returned.
            redacted = redact(response.error_message, request.api_key)
            response = response.model_copy(update={"error_message": redacted})
        return response, client.turns()


def _stored_response(record: RolloutRecord) -> RolloutResponse | None:
    """A record's stored completion body, if it has one that parses."""
    if not record.result:
        return None
    try:
        return RolloutResponse.model_validate_json(record.result)
    except ValueError:
        return None


__all__ = ["V1Carrier", "unreadable_callback_url"]
