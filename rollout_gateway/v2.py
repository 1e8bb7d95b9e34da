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
from typing import cast

from rollout_gateway.limits import check_trainer_url
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
from rollout_worker import tracing, v2
from rollout_worker.envelope import task_message

DRAIN_POLL_SECONDS = 0.2
_REFUSALS = {"draining": ServerDraining, "full": QueueFull, "duplicate": DuplicateRollout}


class FleetRollouts(RolloutService):
    def __init__(self, gateway: Gateway, listener: ChangeListener) -> None:
        self.gateway = gateway
        self.listener = listener
        self.shutting_down = False  # this replica's own shutdown (the fleet may still admit)
        settings = gateway.settings
        self._wait_sec = settings.result_wait_timeout_seconds
        self._lease_sec = settings.polling_lease_timeout_seconds
        self._lease_ms = int(self._lease_sec * 1000)
        self._retention_ms = int(settings.result_retention_seconds * 1000)

    def _record(self, rollout_id: str) -> str:
        return self.gateway.store.keys.record(v2.PROTOCOL, rollout_id)

    async def admit(self, request: RolloutInitRequest) -> RolloutInitResponse:
        if self.shutting_down:
            raise ServerDraining
        gateway = self.gateway
        allowed = gateway.settings.allowed_trainer_urls
        check_trainer_url("chat_completions_url", request.chat_completions_url, allowed)
        token = new_lease_token()
        record = self._record(request.rollout_id)
        outcome = await gateway.store.admit_v2(
            record,
            request.rollout_id,
            max_queued=gateway.settings.max_queued,
            poll_lease_ms=self._lease_ms,
            ttl_ms=int(gateway.settings.inflight_ttl_seconds * 1000),
            message=task_message(
                gateway.celery,
                record,
                request.rollout_id,
                gateway.store.queue,
                tracing.context_fields(),
            ),
            lease_digest=lease_digest(token),
            fields=v2.admission_fields(request, gateway.box),
        )
        if outcome in _REFUSALS:
            raise _REFUSALS[outcome]
        return RolloutInitResponse(
            rollout_id=request.rollout_id,
            status=RolloutStatus.QUEUED,
            polling_lease_token=token,
            result_wait_timeout_sec=self._wait_sec,
            polling_lease_timeout_sec=self._lease_sec,
        )

    async def poll(self, rollout_id: str, lease_token: str) -> RolloutResultResponse | StoredResult:
        record = self._record(rollout_id)
        digest = lease_digest(lease_token)
        with self.listener.watch(record) as changed:
            kind, value = await self.gateway.store.poll(
                record, digest, self._lease_ms, self._retention_ms
            )
            if kind == "unknown":
                raise UnknownRollout
            if kind == "forbidden":
                raise InvalidLease
            if kind == "final":
                return StoredResult(cast(str, value))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_sec):
                    await changed.wait()
        return await self._current(record, rollout_id, lease_token)

    async def _current(
        self, record: str, rollout_id: str, lease_token: str
    ) -> RolloutResultResponse | StoredResult:
        fields = await self.gateway.store.redis.hmget(record, ["status", "lease_digest", "result"])
        status, digest, result = cast(list[str | None], fields)
        if status is None or digest is None:
            raise UnknownRollout
        if not lease_matches(lease_token, digest):
            raise InvalidLease
        if RolloutStatus(status).terminal and result is not None:
            return StoredResult(result)
        return RolloutResultResponse(rollout_id=rollout_id, status=RolloutStatus(status))

    async def cancel(self, request: CancelRolloutsRequest) -> dict[str, str]:
        listed = request.ids is not None
        ids = (
            list(request.ids or [])
            if listed
            else await self.gateway.store.v2_ids(request.prefix or "")
        )
        dispositions = await self.gateway.store.cancel(
            [self._record(rollout_id) for rollout_id in ids], self._retention_ms
        )
        return {
            rollout_id: ("not_found" if disposition == "unknown" else disposition)
            for rollout_id, disposition in zip(ids, dispositions, strict=True)
            if listed or disposition != "unknown"  # prefix/all: only ids the fleet holds
        }

    async def _deployment_id(self) -> str:
        """One id for the whole deployment; it changes only if Redis loses the fleet's state."""
        redis, key = self.gateway.store.redis, self.gateway.store.keys.deployment
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(key, str(uuid.uuid4()), nx=True)
            pipe.get(key)
            _, deployment = await pipe.execute()
        return cast(str, deployment)

    async def _capacity(self) -> int | None:
        workers = await self.gateway.store.live_workers()
        return sum(worker["concurrency"] for worker in workers) or None

    async def _accepting(self) -> bool:
        fenced = await self.gateway.store.redis.exists(self.gateway.store.keys.draining)
        return not (fenced or self.shutting_down)

    async def health(self) -> RolloutServerHealth:
        store = self.gateway.store
        async with store.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(store.keys.active)
            pipe.zcard(store.keys.leases)
            active, running = await pipe.execute()
        deployment = await self._deployment_id()
        return RolloutServerHealth(
            concurrency=HealthConcurrency(
                max_concurrent=await self._capacity(),
                queued=max(active - running, 0),
                running=running,
            ),
            instance_id=os.environ.get(INSTANCE_ID_ENV) or deployment,
            process_id=deployment,
            lifecycle=RolloutLifecycle(
                accepting_rollouts=await self._accepting(), active_rollouts=active
            ),
        )

    async def _active_ids(self) -> list[str]:
        store = self.gateway.store
        records = cast(list[str], await store.redis.zrange(store.keys.active, 0, -1))
        return [store.keys.rollout_key(record) for record in records]

    async def drain(self, timeout_sec: float) -> DrainResponse:
        """Fence admissions fleet-wide, then wait up to ``timeout_sec`` for in-flight work."""
        store = self.gateway.store
        await store.redis.set(store.keys.draining, "1")
        deadline = time.monotonic() + timeout_sec
        # The condition lives in Redis, changed by other processes: poll it.
        while await store.redis.zcard(store.keys.active) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        active = await self._active_ids()
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
        await store.redis.delete(store.keys.draining)
        return RolloutLifecycle(
            accepting_rollouts=await self._accepting(),
            active_rollouts=await store.redis.zcard(store.keys.active),
        )


__all__ = ["FleetRollouts"]
