"""v2 (poll/lease) on the fleet: the SDK's v2 routes over state kept only in Redis.

Admission, polls and cancels are each one Lua call, so any gateway replica can serve any
call: a trainer may admit on one replica and poll on another, or keep polling through a
replica restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid

from rollout_core import tracing
from rollout_core.protocols import v2
from rollout_core.queue.envelope import admission_message
from rollout_core.store import (
    TERMINAL,
    AdmitOutcome,
    CancelOutcome,
    NoHeadroom,
    PollOutcome,
    RecordField,
    RecordKey,
)
from rollout_gateway.headroom import written_bytes
from rollout_gateway.limits import check_nesting, check_trainer_url
from rollout_gateway.listener import ChangeListener
from rollout_gateway.state import Gateway
from rollout_sdk.server.rollout_server import INSTANCE_ID_ENV
from rollout_sdk.server.v2_http import (
    DuplicateRollout,
    InvalidLease,
    QueueFull,
    RolloutService,
    ServerDraining,
    StoredResult,
    UnknownRollout,
    lease_digest,
    lease_matches,
    new_lease_token,
)
from rollout_sdk.types import (
    CancelDisposition,
    CancelRolloutsRequest,
    DrainResponse,
    HealthConcurrency,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutLifecycle,
    RolloutResultResponse,
    RolloutServerHealth,
    RolloutStatus,
)

DRAIN_POLL_SECONDS = 0.2
_REFUSALS = {
    AdmitOutcome.DRAINING: ServerDraining,
    AdmitOutcome.FULL: QueueFull,
    AdmitOutcome.DUPLICATE: DuplicateRollout,
}
# A finished rollout is "not_found" to cancel, as an unknown one is (P§2.5).
_DISPOSITIONS = {
    CancelOutcome.CANCELLED_QUEUED: CancelDisposition.CANCELLED_QUEUED,
    CancelOutcome.CANCELLED_RUNNING: CancelDisposition.CANCELLED_RUNNING,
    CancelOutcome.FINISHED: CancelDisposition.NOT_FOUND,
    CancelOutcome.UNKNOWN: CancelDisposition.NOT_FOUND,
}


class FleetRollouts(RolloutService):
    def __init__(self, gateway: Gateway, listener: ChangeListener) -> None:
        self.gateway = gateway
        self.listener = listener
        self.shutting_down = False  # this replica's own shutdown (the fleet may still admit)
        settings = gateway.settings
        self._wait_sec = settings.result_wait_timeout_seconds
        self._lease_sec = settings.polling_lease_timeout_seconds
        self._retention_sec = settings.result_retention_seconds

    def _key(self, rollout_id: str) -> RecordKey:
        return self.gateway.store.keys.record(v2.PROTOCOL, rollout_id)

    async def admit(self, request: RolloutInitRequest) -> RolloutInitResponse:
        if self.shutting_down:
            raise ServerDraining
        gateway, store = self.gateway, self.gateway.store
        allowed = gateway.settings.allowed_trainer_urls
        check_trainer_url("chat_completions_url", request.chat_completions_url, allowed)
        check_nesting(request)
        token = new_lease_token()
        key = self._key(request.rollout_id)
        message, names = admission_message(
            gateway.celery, key, request.rollout_id, store.queue, tracing.context_fields()
        )
        try:
            await gateway.headroom.check()  # room for it to end, else the full queue's 429
        except NoHeadroom:
            if await store.admissions_fenced():  # draining comes first (CONFORMANCE #72)
                raise ServerDraining from None
            raise
        fields = {**v2.admission_fields(request, gateway.box), **names}
        outcome = await store.admit_v2(
            key,
            max_queued=gateway.settings.max_queued,
            polling_lease_seconds=self._lease_sec,
            ttl_seconds=gateway.settings.inflight_ttl_seconds,
            message=message,
            lease_digest=lease_digest(token),
            fields=fields,
        )
        if outcome in _REFUSALS:
            raise _REFUSALS[outcome]
        gateway.headroom.admitted(written_bytes(message, fields))
        return RolloutInitResponse(
            rollout_id=request.rollout_id,
            status=RolloutStatus.QUEUED,
            polling_lease_token=token,
            result_wait_timeout_sec=self._wait_sec,
            polling_lease_timeout_sec=self._lease_sec,
        )

    async def poll(self, rollout_id: str, lease_token: str) -> RolloutResultResponse | StoredResult:
        key = self._key(rollout_id)
        with self.listener.watch(key) as watch:
            reply = await self.gateway.store.poll(
                key,
                lease_digest(lease_token),
                polling_lease_seconds=self._lease_sec,
                retention_seconds=self._retention_sec,
                lease_expired_result=v2.lease_expired_json(rollout_id),
            )
            if reply.outcome is PollOutcome.UNKNOWN:
                raise UnknownRollout
            if reply.outcome is PollOutcome.FORBIDDEN:
                raise InvalidLease
            if reply.outcome is PollOutcome.FINAL and reply.result is not None:
                return StoredResult(reply.result)
            status = reply.status
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_sec):
                    await watch.changed.wait()
                status = watch.status
        # Authenticated above, the status at hand is the answer — unless the rollout finished
        # (its result is read), the listener lost track, or the change is older than what the
        # poll saw (a listener lagging behind; or a hand-back to queued): the record decides.
        stale = reply.status is not None and status is not None and status.precedes(reply.status)
        if status is None or status in TERMINAL or stale:
            return await self._current(key, rollout_id, lease_token)
        return RolloutResultResponse(rollout_id=rollout_id, status=RolloutStatus(status))

    async def _current(
        self, key: RecordKey, rollout_id: str, lease_token: str
    ) -> RolloutResultResponse | StoredResult:
        record = await self.gateway.store.load(
            key, RecordField.STATUS, RecordField.LEASE_DIGEST, RecordField.RESULT
        )
        if record.status is None or record.lease_digest is None:
            raise UnknownRollout
        if not lease_matches(lease_token, record.lease_digest):
            raise InvalidLease
        if record.finished:  # a result told is one a failover keeps
            record = await self.gateway.store.confirm_replicated(key, record)
        if record.finished and record.result is not None:
            return StoredResult(record.result)
        if record.status is None:
            raise UnknownRollout
        return RolloutResultResponse(rollout_id=rollout_id, status=RolloutStatus(record.status))

    async def cancel(self, request: CancelRolloutsRequest) -> dict[str, CancelDisposition]:
        store = self.gateway.store
        listed = request.ids is not None
        ids = list(request.ids or []) if listed else await store.v2_ids(request.prefix or "")
        keys = {self._key(rollout_id): rollout_id for rollout_id in ids}
        outcomes = await store.cancel(
            {key: v2.cancelled_json(rollout_id) for key, rollout_id in keys.items()},
            self._retention_sec,
        )
        return {
            keys[key]: _DISPOSITIONS[outcome]
            for key, outcome in outcomes.items()
            if listed or outcome is not CancelOutcome.UNKNOWN  # prefix/all: ids the fleet holds
        }

    async def _deployment_id(self) -> str:
        """One id for the whole deployment; it changes only if Redis loses the fleet's state."""
        return await self.gateway.store.deployment_id(str(uuid.uuid4()))

    async def _accepting(self) -> bool:
        return not (self.shutting_down or await self.gateway.store.admissions_fenced())

    async def health(self) -> RolloutServerHealth:
        store = self.gateway.store
        counts = await store.counts()
        deployment = await self._deployment_id()
        return RolloutServerHealth(
            concurrency=HealthConcurrency(
                max_concurrent=(await store.live_workers()).slots or None,
                queued=max(counts.active - counts.running, 0),
                running=counts.running,
            ),
            instance_id=os.environ.get(INSTANCE_ID_ENV) or deployment,
            process_id=deployment,
            lifecycle=RolloutLifecycle(
                accepting_rollouts=await self._accepting(), active_rollouts=counts.active
            ),
        )

    async def drain(self, timeout_sec: float) -> DrainResponse:
        """Fence admissions fleet-wide, then wait up to ``timeout_sec`` for in-flight work."""
        store = self.gateway.store
        await store.fence_admissions(self.gateway.settings.drain_fence_seconds)
        deadline = time.monotonic() + timeout_sec
        # The condition lives in Redis, changed by other processes: poll it.
        while (await store.counts()).active and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        active = await store.active_record_ids()
        return DrainResponse(
            drained=not active,
            accepting_rollouts=False,
            active_rollouts=len(active),
            process_id=await self._deployment_id(),
            rollout_ids=active,
        )

    async def resume(self) -> RolloutLifecycle:
        """Lift a drain fence (extension: ``DELETE /drain``)."""
        store = self.gateway.store
        await store.lift_fence()
        return RolloutLifecycle(
            accepting_rollouts=await self._accepting(),
            active_rollouts=(await store.counts()).active,
        )


__all__ = ["FleetRollouts"]
