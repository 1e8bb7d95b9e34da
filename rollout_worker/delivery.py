"""A v1 rollout's completion callback: stored, posted, and how it went recorded.

The completion body is stored (status ``delivering``) before it is posted, so a worker that
dies mid-delivery leaves a result another worker delivers instead of a rollout the trainer
never hears about. Each POST attempt (the SDK's retries included) goes on the wire only after
the lease is confirmed (:meth:`Lease.confirm`, at the moment its headers are written, and
again before its body), so a worker that was frozen or lost its lease never posts a result
another worker now owns. A POST on the wire is seen through: a cancel or a lost lease waits
for it (the trainer may be reading it); before that, a lost lease stops it. Every callback of
one admission carries the same ``Idempotency-Key`` (its admission token) so a receiver can
drop a repeat, and a new admission of the same id gets a new one. The write that records the
trainer's answer is retried through any Redis outage, the execution holding its lease
meanwhile. Where a repeat can still happen, and how wide each window is: docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from rollout_core.protocols.v1 import PROTOCOL
from rollout_core.secrets import redact
from rollout_core.store import Advance, Claim, RecordField, RolloutRecord, Status, StoreError
from rollout_sdk.client import OsmosisLLMClient, Turn
from rollout_sdk.core.exceptions import (
    OsmosisRolloutError,
    OsmosisServerError,
    OsmosisTimeoutError,
    OsmosisValidationError,
    RefusedDestinationError,
)
from rollout_sdk.core.foreign import describe
from rollout_sdk.core.schemas import RolloutRequest, RolloutResponse, RolloutStatus
from rollout_sdk.runner import error_response
from rollout_worker import metrics
from rollout_worker.execution import CANCELLED, Lease
from rollout_worker.result_budget import ResultBudget

logger = logging.getLogger(__name__)

AGENT_ERROR = "agent_error"  # v1 results carry no error category; a failed one is the agent's
# Recording a trainer's answer is retried through a Redis outage: first after this pause,
# doubling up to a third of the lease (the heartbeat's period).
ANSWER_RETRY_SECONDS = 0.25


class _LeaseLost(Exception):
    """Raised before a POST attempt goes out: another execution owns the rollout now."""


# Delivery lines a record may end with that say the trainer may hold more than one callback
# (the nemesis checker reads them to know how many repeats a record owns up to).
TIMED_OUT = "failed: the trainer did not answer in time (it may have received the callback)"
# "failed: <why>, after its callback went out <N> time(s) (the trainer may have it)": a record
# its own execution ended with N attempts on the wire (a fault, a stop).
ENDED_ON_THE_WIRE = re.compile(
    r"failed: .+, after its callback went out (\d+) times? \(the trainer may have it\)"
)


def ended_on_the_wire(why: str, attempts: int) -> str:
    """The delivery line of a rollout ended by its own execution with ``attempts`` of its
    callback on the wire (matches :data:`ENDED_ON_THE_WIRE`)."""
    times = "1 time" if attempts == 1 else f"{attempts} times"
    return f"failed: {why}, after its callback went out {times} (the trainer may have it)"


def delivery_failure(exc: Exception) -> str:
    """What the record says about a failed callback: the status or the kind of failure, never
    the receiver's answer (a foreign endpoint's body must not be stored or returned)."""
    if isinstance(exc, OsmosisValidationError | OsmosisServerError):
        return f"failed: the trainer answered HTTP {exc.status_code}"
    if isinstance(exc, RefusedDestinationError):  # our own words, never the receiver's
        return f"failed: {exc}"
    if isinstance(exc, OsmosisTimeoutError):
        return TIMED_OUT
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
class Callback:
    """Where a rollout's completion callback goes, and the key it carries (``None``: sent
    without ``Authorization``)."""

    server_url: str
    rollout_id: str
    api_key: str | None

    @classmethod
    def of(cls, request: RolloutRequest) -> Callback:
        return cls(request.server_url, request.rollout_id, request.api_key)


class CallbackDelivery:
    """Stores a rollout's completion body and posts it, for the v1 carrier."""

    def __init__(
        self, client_for: Callable[[Callback], OsmosisLLMClient], budget: ResultBudget
    ) -> None:
        self._client_for = client_for
        self._budget = budget

    async def store_and_post(
        self,
        claim: Claim,
        lease: Lease,
        to: Callback,
        response: RolloutResponse,
        turns: list[Turn] | None = None,
    ) -> Status | None:
        """Store the completion body, then post it. If the rollout's cancellation was requested
        meanwhile, the cancelled response is stored and posted instead (never a success). A
        result over the budget is stored and posted as the failure that says so."""
        turns_json = json.dumps(turns or [])
        wire = response.wire_json()
        if (over := self._budget.over(wire, turns_json)) is not None:
            logger.warning("rollout %s: %s", to.rollout_id, over)
            failed = error_response(to.rollout_id, over)
            response = failed.model_copy(update={"metrics": response.metrics})
            wire, turns_json = response.wire_json(), "[]"
        fields = {RecordField.TURNS: turns_json}
        cancelled = error_response(to.rollout_id, CANCELLED)
        advanced = await lease.advance(
            Status.DELIVERING,
            result=wire,
            cancelled_result=cancelled.wire_json(),
            fields=fields,
        )
        if advanced is Advance.LOST:
            return None
        if advanced is Advance.CANCELLED:
            response = cancelled
        return await self.post_stored(claim, lease, to, response)

    async def post_stored(
        self, claim: Claim, lease: Lease, to: Callback, response: RolloutResponse
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
        self, lease: Lease, to: Callback, response: RolloutResponse, wire: _Wire
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

    async def _post(self, to: Callback, response: RolloutResponse, wire: _Wire) -> str:
        try:
            await self._client_for(to).post_completion(
                response, idempotency_key=wire.idempotency_key, before_send=wire.before_send
            )
        except (_LeaseLost, StoreError):
            raise  # not the callback's failure: Redis could not confirm the lease (it passes)
        except Exception as exc:  # every failure counts once: the rollout ends, saying why
            reason = redact(describe(exc), to.api_key)
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
        self.sent = False  # an attempt's body went on the wire: the trainer may act on it
        self._checks = 0

    @property
    def attempts(self) -> int:
        """Attempts whose whole request went out (checked at its headers and at its body)."""
        return self._checks // 2

    async def before_send(self) -> None:
        """Before an attempt's headers, then its body: each only while the lease holds and
        posting is not barred. Only a body lets the trainer act on the callback, so an
        attempt counts as gone out (the lease's ``posted``) from its body on."""
        if not await self._lease.confirm():  # also False once barred
            raise _LeaseLost
        if self._checks % 2:  # its body
            if not self._lease.mark_posted():  # barred meanwhile, from another thread
                raise _LeaseLost
            self.sent = True
        self._checks += 1
        self._lease.attempts_out = self.attempts


__all__ = [
    "AGENT_ERROR",
    "ENDED_ON_THE_WIRE",
    "TIMED_OUT",
    "Callback",
    "CallbackDelivery",
    "delivery_failure",
    "ended_on_the_wire",
    "idempotency_key",
    "terminal_status",
]
