"""v1 routes (PROTOCOL.md §1): ``POST /v1/rollout/init``, ``GET /health``, ``GET /platform/health``.

Admission of a new idempotency key:

1. ``admit_begin`` claims the key (status ``admitting``); concurrent duplicates wait, a
   known key replays the stored 202 body byte for byte.
2. The agent's ``get_tools`` runs on a thread, with a timeout.
3. ``admit_commit`` writes the record and enqueues the task in one atomic step, then 202.
   If ``get_tools`` failed, ``admit_abort`` forgets the key so a retry starts afresh.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from rollout_gateway.limits import check_trainer_url
from rollout_gateway.state import AuthorizationHeader, Gateway, GatewayDep
from rollout_sdk.core.schemas import HealthResponse, InitResponse, RolloutRequest
from rollout_sdk.runner import PreparedRollout, ToolsError, prepare_rollout
from rollout_sdk.server.http import INVALID_KEY_DETAIL, require_platform_key, require_v1_key
from rollout_worker import tracing, v1
from rollout_worker.envelope import task_message
from rollout_worker.secrets import redact

router = APIRouter(tags=["v1"])

# How long past the get_tools timeout a pending admission keeps its key.
PENDING_MARGIN_SECONDS = 5.0
_FIRST_WAIT_SECONDS = 0.005
_MAX_WAIT_SECONDS = 0.1


def _accepted(body: str) -> Response:
    return Response(content=body, status_code=202, media_type="application/json")


async def _prepare(gateway: Gateway, request: RolloutRequest) -> PreparedRollout:
    """``get_tools`` on a worker thread; a raise or a hang becomes a clear 500."""
    loop = asyncio.get_running_loop()
    timeout = gateway.settings.get_tools_timeout_seconds
    call = loop.run_in_executor(gateway.tools_pool, prepare_rollout, gateway.agent_loop, request)
    try:
        return await asyncio.wait_for(call, timeout)
    except ToolsError as exc:
        detail = redact(str(exc), request.api_key)
    except TimeoutError:
        detail = f"get_tools() did not return within {timeout:g}s"
    raise HTTPException(status_code=500, detail=detail)


async def admit(gateway: Gateway, request: RolloutRequest) -> Response:
    store, settings = gateway.store, gateway.settings
    record = store.keys.record(v1.PROTOCOL, request.idempotency_token)
    pending_seconds = settings.get_tools_timeout_seconds + PENDING_MARGIN_SECONDS
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + pending_seconds
    wait = _FIRST_WAIT_SECONDS
    while True:
        token = uuid.uuid4().hex
        verdict, stored = await store.admit_begin(record, token, int(pending_seconds * 1000))
        if verdict == "replay" and stored is not None:
            return _accepted(stored)
        if verdict == "lead":
            try:
                prepared = await _prepare(gateway, request)
            except BaseException:
                await store.admit_abort(record, token)
                raise
            body = prepared.response.model_dump_json()
            committed = await store.admit_commit(
                record,
                token,
                int(settings.inflight_ttl_seconds * 1000),
                task_message(
                    gateway.celery,
                    record,
                    request.rollout_id,
                    store.queue,
                    tracing.context_fields(),
                ),
                v1.admission_fields(request, body, gateway.box),
            )
            if committed:
                return _accepted(body)
            # Our claim lapsed while get_tools ran and another admission won: replay it.
        elif loop.time() > give_up_at:
            raise HTTPException(
                status_code=503, detail="an admission with this key is still in progress; retry"
            )
        await asyncio.sleep(wait)
        wait = min(wait * 2, _MAX_WAIT_SECONDS)


@router.post(
    "/v1/rollout/init",
    status_code=202,
    response_model=InitResponse,
    responses={401: {"description": INVALID_KEY_DETAIL}, 500: {"description": "get_tools failed"}},
)
async def init_rollout(
    request: RolloutRequest, gateway: GatewayDep, authorization: AuthorizationHeader = None
) -> Response:
    require_v1_key(authorization, gateway.api_key)  # after body validation, as the reference
    allowed = gateway.settings.allowed_trainer_urls
    check_trainer_url("server_url", request.server_url, allowed)
    if request.tool_server_url is not None:
        check_trainer_url("tool_server_url", request.tool_server_url, allowed)
    return await admit(gateway, request)


async def _health(gateway: Gateway) -> HealthResponse:
    active, completed = await gateway.store.counts()
    return HealthResponse(
        agent_loop=gateway.agent_loop.name, active_rollouts=active, completed_rollouts=completed
    )


@router.get("/health", response_model=HealthResponse)
async def health(gateway: GatewayDep) -> HealthResponse:
    return await _health(gateway)


@router.get("/platform/health", response_model=HealthResponse)
async def platform_health(
    gateway: GatewayDep, authorization: AuthorizationHeader = None
) -> HealthResponse:
    require_platform_key(authorization, gateway.api_key)
    return await _health(gateway)
