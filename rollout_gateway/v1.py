"""v1 on the fleet (PROTOCOL.md §1): the SDK's v1 routes (``rollout_sdk.server.v1_http``) over
records kept in Redis.

Admission of a new idempotency key:

1. ``admit_begin`` takes the admission key (status ``admitting``); concurrent duplicates wait, a
   known key replays the stored 202 body byte for byte.
2. The agent's ``get_tools`` runs on a thread, with a timeout.
3. ``admit_commit`` writes the record and enqueues the task in one atomic step, then 202.
   If ``get_tools`` failed, ``admit_abort`` forgets the key so a retry starts afresh.
"""

from __future__ import annotations

import asyncio
import uuid

from rollout_core import tracing
from rollout_core.protocols import v1
from rollout_core.queue.envelope import admission_message
from rollout_core.secrets import redact
from rollout_core.store import AdmitStart, RecordKey
from rollout_gateway.headroom import written_bytes
from rollout_gateway.limits import check_nesting, check_trainer_url
from rollout_gateway.state import Gateway
from rollout_sdk.core.schemas import HealthResponse, RolloutRequest
from rollout_sdk.runner import PreparedRollout, ToolsError
from rollout_sdk.server.v1_http import AdmissionInProgress, V1Service

# How long past the get_tools timeout a pending admission keeps its key.
PENDING_MARGIN_SECONDS = 5.0
_FIRST_WAIT_SECONDS = 0.005
_MAX_WAIT_SECONDS = 0.1


class FleetV1Service(V1Service):
    """v1 rollouts admitted into the fleet's Redis; any gateway replica serves any call."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.agent_loop = gateway.agent_loop()
        self._pending_seconds = gateway.settings.get_tools_timeout_seconds + PENDING_MARGIN_SECONDS

    async def admit(self, request: RolloutRequest) -> str:
        allowed = self.gateway.settings.allowed_trainer_urls
        check_trainer_url("server_url", request.server_url, allowed)
        if request.tool_server_url is not None:
            check_trainer_url("tool_server_url", request.tool_server_url, allowed)
        check_nesting(request)
        store = self.gateway.store
        key = store.keys.record(v1.PROTOCOL, request.idempotency_token)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._pending_seconds
        wait = _FIRST_WAIT_SECONDS
        while True:
            token = uuid.uuid4().hex
            started = await store.admit_begin(key, token, self._pending_seconds)
            if started.start is AdmitStart.REPLAY and started.response is not None:
                return started.response
            if started.start is AdmitStart.LEAD:
                body = await self._lead(key, token, request)
                if body is not None:
                    return body
                # Our admission key lapsed while get_tools ran and another admission won: replay it.
            elif loop.time() > give_up_at:
                raise AdmissionInProgress
            await asyncio.sleep(wait)
            wait = min(wait * 2, _MAX_WAIT_SECONDS)

    async def _lead(self, key: RecordKey, token: str, request: RolloutRequest) -> str | None:
        """Prepare the rollout and commit it while we hold the admission key; None if it lapsed."""
        gateway, store = self.gateway, self.gateway.store
        try:
            await gateway.headroom.check()  # room for it to end, else a full store's 503
            prepared = await self._prepare(request)
        except BaseException:
            await store.admit_abort(key, token)
            raise
        body = prepared.response.model_dump_json()
        message, names = admission_message(
            gateway.celery, key, request.rollout_id, store.queue, tracing.context_fields()
        )
        fields = {**v1.admission_fields(request, body, gateway.box), **names}
        committed = await store.admit_commit(
            key, token, gateway.settings.inflight_ttl_seconds, message, fields
        )
        if committed:
            gateway.headroom.admitted(written_bytes(message, fields))
        return body if committed else None

    async def _prepare(self, request: RolloutRequest) -> PreparedRollout:
        """``get_tools`` on a thread (``tools.py``); a raise or a hang is a ``ToolsError``."""
        try:
            return await self.gateway.tools.prepare(self.agent_loop, request)
        except ToolsError as exc:
            raise ToolsError(redact(str(exc), request.api_key)) from None

    async def health(self) -> HealthResponse:
        counts = await self.gateway.store.counts()
        return HealthResponse(
            agent_loop=self.agent_loop.name,
            active_rollouts=counts.active,
            completed_rollouts=counts.finished,
        )


__all__ = ["FleetV1Service"]
