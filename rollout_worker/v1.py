"""The v1 carrier: runs the agent loop and delivers its completion callback.

The completion body is stored (status ``delivering``) before it is posted, so a worker that
dies mid-delivery leaves a result another worker delivers instead of a rollout the trainer
never hears about. Each POST attempt (the SDK's retries included) goes on the wire only after
the lease is confirmed (:meth:`Lease.confirm`, at the moment its headers are written), so a
worker that was frozen or lost its lease never posts a result another worker now owns. A
POST on the wire is seen through: a cancel or a lost lease waits for it (the trainer may be
reading it); before that, a lost lease stops it. Every callback of one admission carries the
same ``Idempotency-Key`` (its admission token) so a receiver can drop a repeat, and a new
admission of the same id gets a new one. A repeat happens only when a worker dies between a
POST and the write that records its answer, or when the trainer does not answer an attempt
in time and the SDK retries it (docs/RELIABILITY.md): the write that records an answer is
retried through any Redis outage, the execution holding its lease meanwhile.

A rollout the worker cannot carry (its record cannot be read: the API key does not open, the
request does not parse; or the worker faulted on it) still ends with one ERROR callback
saying why, sent without ``Authorization`` (the key is what may not be readable).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rollout_core.protocols.v1 import PROTOCOL, request_from_record
from rollout_core.secrets import SecretBox, redact
from rollout_core.store import (
    Advance,
    Claim,
    Protocol,
    RecordField,
    RolloutRecord,
    Status,
    StoreError,
    Verdict,
)
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
# Recording a trainer's answer is retried through a Redis outage: first after this pause,
# doubling up to a third of the lease (the heartbeat's period).
ANSWER_RETRY_SECONDS = 0.25
# A request whose JSON no longer parses at all may still name its callback URL.
_SERVER_URL = re.compile(r'"server_url"\s*:\s*"([^"\\]+)"')


class _LeaseLost(Exception):
    """Raised before a POST attempt goes out: another execution owns the rollout now."""


def delivery_failure(exc: Exception) -> str:
    """What the record says about a failed callback: the status or the kind of failure, never
    the receiver's answer (a foreign endpoint's body must not be stored or returned)."""
    if isinstance(exc, OsmosisValidationError | OsmosisServerError):
        return f"failed: the trainer answered HTTP {exc.status_code}"
    if isinstance(exc, RefusedDestinationError):  # our own words, never the receiver's
        return f"failed: {exc}"
    if isinstance(exc, OsmosisTimeoutError):
        return "failed: the trainer did not answer in time (it may have received the callback)"
    if isinstance(exc, OsmosisRolloutError):
        return "failed: the trainer could not be reached"
    # Not the trainer's doing: the same request would fail the same way every time.
    return f"failed: the callback could not be sent ({type(exc).__name__})"


def idempotency_key(record: RolloutRecord) -> str:
    """The ``Idempotency-Key`` of a rollout's callbacks: its admission's token, unique per
    admission and header-safe whatever its ids hold."""
    if record.admit_token:
        return record.admit_token
    # A record admitted before tokens were kept: a digest of its id, stable across repeats.
    return hashlib.sha256(record.rollout_id.encode()).hexdigest()[:32]


def terminal_status(response: RolloutResponse) -> Status:
    return Status.SUCCESS if response.status is RolloutStatus.COMPLETED else Status.FAILURE


@dataclass(frozen=True)
class _Callback:
    """Where a rollout's completion callback goes, and the key it carries (``None``: sent
    without ``Authorization``)."""

    server_url: str
    rollout_id: str
    api_key: str | None

    @classmethod
    def of(cls, request: RolloutRequest) -> _Callback:
        return cls(request.server_url, request.rollout_id, request.api_key)


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
        debug_dir: str | None = None,
    ) -> None:
        self.retention_seconds = retention_seconds
        self._time_limit = time_limit  # seconds on this worker; 0: none
        self._agent_loop = agent_loop
        self._http = http
        self._box = box
        self._sdk_settings = sdk_settings
        self._debug_dir = debug_dir

    def _client(self, to: _Callback) -> OsmosisLLMClient:
        return OsmosisLLMClient(
            to.server_url,
            to.rollout_id,
            to.api_key,
            settings=self._sdk_settings,
            http_client=self._http.for_rollout(to.rollout_id),
        )

    async def carry(self, claim: Claim, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        to = _Callback.of(request)
        if claim.verdict is Verdict.DELIVERING:  # a worker died delivering it: deliver again
            stored = RolloutResponse.model_validate_json(claim.record.result or "")
            return await self._deliver_stored(claim, lease, to, stored)
        response, turns = await self._run(claim, request)
        return await self._deliver(claim, lease, to, response, turns)

    async def refuse(self, claim: Claim, refusal: Refusal, lease: Lease) -> Status | None:
        request = request_from_record(claim.record, self._box)
        if claim.verdict is Verdict.DELIVERING:  # its result exists: never replaced
            return await self.carry(claim, lease)
        if claim.record.status is Status.DELIVERING:  # exhausted delivering: ends undelivered
            return await self._give_up_delivery(claim, lease)
        response = error_response(request.rollout_id, refusal.message)
        return await self._deliver(claim, lease, _Callback.of(request), response)

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
        to = _Callback(url, rollout_id, None)
        if claim.verdict is Verdict.DELIVERING:
            stored = _stored_response(claim.record)
            if stored is not None:
                return await self._deliver_stored(claim, lease, to, stored)
        return await self._deliver(claim, lease, to, response)

    async def _end_after_fault(self, lease: Lease, message: str) -> Status | None:
        """The worker faulted after this execution's callback went out: the rollout ends with
        the stored result's status, not posted again."""
        stored = _stored_response(await lease.store.load(lease.key, RecordField.RESULT))
        status = Status.FAILURE if stored is None else terminal_status(stored)
        delivery = f"failed: {message}, after its callback went out (the trainer may have it)"
        advanced = await lease.advance(status, fields={RecordField.DELIVERY: delivery})
        return None if advanced is Advance.LOST else status

    async def _run(
        self, claim: Claim, request: RolloutRequest
    ) -> tuple[RolloutResponse, list[Turn]]:
        """Run the agent (the trainer hears back whatever happens); with what each of its LLM
        calls returned besides the message."""
        assert self._agent_loop is not None, "a v1 rollout reached a worker without a v1 agent"
        tools: list[Any] = json.loads(claim.record.response or "{}")["tools"]
        client = self._client(_Callback.of(request))
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
        claim: Claim,
        lease: Lease,
        to: _Callback,
        response: RolloutResponse,
        turns: list[Turn] | None = None,
    ) -> Status | None:
        """Store the completion body, then post it. If the rollout's cancellation was requested
        meanwhile, the cancelled response is stored and posted instead (never a success)."""
        fields = {RecordField.TURNS: json.dumps(turns or [])}
        cancelled = error_response(to.rollout_id, CANCELLED)
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
        return await self._deliver_stored(claim, lease, to, response)

    async def _deliver_stored(
        self, claim: Claim, lease: Lease, to: _Callback, response: RolloutResponse
    ) -> Status | None:
        """Post and record the outcome. An operator's cancel never cuts it (the result is
        stored and final); a lost lease stops it only while no attempt is on the wire."""
        wire = _Wire(lease, idempotency_key(claim.record))
        delivery = asyncio.ensure_future(self._post_and_record(lease, to, response, wire))
        task = asyncio.current_task()
        while True:
            try:
                return await asyncio.shield(delivery)
            except asyncio.CancelledError:
                if delivery.cancelled():
                    raise
                if lease.lost and not wire.sent:
                    delivery.cancel()
                    logger.info(
                        "rollout %s: lease lost before its callback went out", to.rollout_id
                    )
                    raise
                if task is not None:
                    task.uncancel()  # seen through first; the outcome says what happened
                logger.info("rollout %s: cancel waits for its delivery", to.rollout_id)

    async def _post_and_record(
        self, lease: Lease, to: _Callback, response: RolloutResponse, wire: _Wire
    ) -> Status | None:
        try:
            delivery = await self._post(to, response, wire)
        except _LeaseLost:
            logger.warning(
                "rollout %s: lease lost; its callback was not posted here", to.rollout_id
            )
            return None
        status = terminal_status(response)
        advanced = await self._record_answer(lease, status, delivery, to.rollout_id)
        if advanced is Advance.LOST:
            return None
        metrics.rollout_finished(
            PROTOCOL, status, None if status is Status.SUCCESS else AGENT_ERROR
        )
        return status

    @staticmethod
    async def _record_answer(
        lease: Lease, status: Status, delivery: str, rollout_id: str
    ) -> Advance:
        """Record how the callback went, retrying through any Redis outage (from
        ``ANSWER_RETRY_SECONDS``, doubling up to a third of the lease): the execution stays
        registered meanwhile, so the heartbeat renews its lease as soon as Redis answers, and
        no sweeper hands the stored result to another worker to post again."""
        pause, tries = ANSWER_RETRY_SECONDS, 0
        while True:
            try:
                advanced = await lease.advance(status, fields={RecordField.DELIVERY: delivery})
            except StoreError as exc:
                if tries == 0:
                    logger.warning(
                        "rollout %s: the trainer answered, but Redis does not take the answer "
                        "(%s); retrying until it does",
                        rollout_id,
                        type(exc).__name__,
                    )
                tries += 1
                await asyncio.sleep(pause)
                pause = min(2 * pause, lease.seconds / 3)
                continue
            if tries and advanced is not Advance.LOST:
                logger.warning(
                    "rollout %s: the trainer's answer recorded after %d retries", rollout_id, tries
                )
            return advanced

    async def _post(self, to: _Callback, response: RolloutResponse, wire: _Wire) -> str:
        try:
            await self._client(to).post_completion(
                response, idempotency_key=wire.idempotency_key, before_send=wire.before_send
            )
        except (_LeaseLost, StoreError):
            raise  # not the callback's failure: Redis could not confirm the lease (it passes)
        except Exception as exc:  # every failure counts once: the rollout ends, saying why
            reason = redact(str(exc), to.api_key)
            logger.warning(
                "rollout %s: completion callback not delivered: %s", to.rollout_id, reason
            )
            metrics.CALLBACKS.labels("failed").inc()
            return delivery_failure(exc)
        metrics.CALLBACKS.labels("delivered").inc()
        if wire.attempts > 1:  # earlier attempts were sent whole: they timed out, broke or 5xx'd
            return (
                f"delivered on attempt {wire.attempts}; the trainer may have received the "
                f"{wire.attempts - 1} before"
            )
        return "delivered"


class _Wire:
    """One delivery's POST attempts: each goes out only while the lease holds, checked as its
    headers and again as its body are about to be written."""

    def __init__(self, lease: Lease, idempotency_key: str) -> None:
        self._lease = lease
        self.idempotency_key = idempotency_key
        self.sent = False  # an attempt's request reached the wire
        self._checks = 0

    @property
    def attempts(self) -> int:
        """Attempts whose whole request went out (checked at its headers and at its body)."""
        return self._checks // 2

    async def before_send(self) -> None:
        if not await self._lease.confirm():
            raise _LeaseLost
        self._checks += 1
        self.sent = True
        self._lease.posted = True


def _stored_response(record: RolloutRecord) -> RolloutResponse | None:
    """A record's stored completion body, if it has one that parses."""
    if not record.result:
        return None
    try:
        return RolloutResponse.model_validate_json(record.result)
    except ValueError:
        return None


__all__ = ["V1Carrier", "delivery_failure", "idempotency_key", "unreadable_callback_url"]
