"""The gateway: a stateless FastAPI front that admits rollouts into Redis.

It serves the protocol generation of the agent it is given: the SDK's v1 routes for a
``RolloutAgentLoop``, its v2 (poll/lease) routes for an ``AgentWorkflow``, each over a service
that keeps everything in Redis (``v1.py``, ``v2.py``). Any replica can answer any call:
admission, deduplication, long-polls and health all go through the records in Redis, never
through this process's memory. Run several behind one port (``rollout-fleet gateway
--workers N``) or on several hosts, and they behave as one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.params import Depends as Dependency
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollout_core import tracing
from rollout_core.durability import Agreement, RedisWatch, StartRefused, start_checks
from rollout_core.polling_clock import PollingClock
from rollout_core.queue import celery_app
from rollout_core.secrets import keep_key_canary, load_secret_box
from rollout_core.settings import FleetSettings
from rollout_core.store import RecordStore, StoreFull, StoreUnavailable
from rollout_gateway import lookup, metrics, ready
from rollout_gateway.headroom import Headroom
from rollout_gateway.limits import ERROR_RESPONSES, BodySizeLimit, OpenBindRefusal
from rollout_gateway.listener import ChangeListener
from rollout_gateway.state import Gateway
from rollout_gateway.tools import ToolsRunner
from rollout_gateway.upkeep import keep_waiting_rollouts
from rollout_gateway.v1 import FleetV1Service
from rollout_gateway.v2 import FleetRollouts
from rollout_sdk.config import get_settings
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import load_agent
from rollout_sdk.server.auth import V1ServerKey, require_bearer
from rollout_sdk.server.http import install_error_handlers, settle_heap
from rollout_sdk.server.v1_http import V1Service, v1_router
from rollout_sdk.server.v2_http import QUEUE_FULL, RolloutService, v2_router


async def _store_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={"detail": f"rollout store unavailable ({type(exc).__name__}); retry later"},
        headers={"Retry-After": "5"},
    )


async def _store_full(request: Request, _: Exception) -> JSONResponse:
    """Redis at ``maxmemory`` refuses writes: a v2 admission is told the queue is full (its
    client waits and retries), anything else that the store is. Any other error reply is a
    bug: a 500."""
    if request.method == "POST" and request.url.path == "/rollout":
        return JSONResponse({"detail": QUEUE_FULL}, status_code=429, headers={"Retry-After": "5"})
    return JSONResponse(
        status_code=503,
        content={"detail": "rollout store is full (Redis maxmemory); retry later"},
        headers={"Retry-After": "5"},
    )


class StartRefusalInOneLine:
    """A start the lifespan refuses for its Redis (:class:`StartRefused`: it can lose
    rollouts, another fleet holds the queue, too few replicas) fails with that one line, as
    ``rollout-fleet gateway`` says it before it starts uvicorn, and not the traceback the
    framework sends with it (a newcomer reads the first line of a log)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # sent below, once the exception tells what failed
                return
            await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except StartRefused as exc:
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        except BaseException:
            for message in held:
                await send(message)
            raise
        for message in held:
            await send(message)


def _v1_service(request: Request) -> V1Service:
    service: V1Service = request.app.state.service
    return service


def _v2_service(request: Request) -> RolloutService:
    service: RolloutService = request.app.state.service
    return service


def _routes(app: FastAPI, speaks_v1: bool, api_key: str | None) -> None:
    """The generation's routes, and its server-key check on every route that needs one: v1
    checks it per route (after the body), v2 before anything, on every route."""
    operator_auth: Sequence[Dependency] = []
    if speaks_v1:
        server_key = V1ServerKey(api_key)
        operator_auth = [Depends(server_key)]
        app.include_router(v1_router(_v1_service, server_key), responses=ERROR_RESPONSES)
    else:
        if api_key is not None:
            require_bearer(app, api_key)
        app.include_router(v2_router(_v2_service), responses=ERROR_RESPONSES)
    for router in (ready.router, metrics.router, lookup.router):
        app.include_router(router, dependencies=operator_auth, responses=ERROR_RESPONSES)


def create_app(settings: FleetSettings | None = None) -> FastAPI:
    """Build a gateway for the configured agent (fails fast if the agent cannot load)."""
    settings = settings or celery_app.settings
    get_settings()  # a bad OSMOSIS_ROLLOUT_* value fails here, at startup
    if not settings.agent:
        raise RuntimeError("no agent configured: set AGENT (or ROLLOUT_FLEET_AGENT) to module:attr")
    agent = load_agent(settings.agent)
    speaks_v1 = isinstance(agent, RolloutAgentLoop)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = RecordStore.connect(settings)
        agreement = Agreement.of(store, settings, agent.name, admits=True)
        await start_checks(store, settings, agreement, admits=True)
        tools = ToolsRunner(settings.get_tools_threads, settings.get_tools_timeout_seconds)
        box = await load_secret_box(store, settings)
        await keep_key_canary(store, box)
        gateway = Gateway(
            settings=settings,
            celery=celery_app.app,
            agent=agent,
            store=store,
            box=box,
            tools=tools,
            watch=RedisWatch(store, settings),
            headroom=Headroom(store, settings),
        )
        app.state.gateway = gateway
        listener = None if speaks_v1 else ChangeListener(store)
        app.state.service = (
            FleetV1Service(gateway) if listener is None else FleetRollouts(gateway, listener)
        )
        chores = [
            asyncio.create_task(PollingClock(store).run(), name="polling-clock"),
            asyncio.create_task(gateway.headroom.run(), name="headroom"),
            asyncio.create_task(keep_waiting_rollouts(store, settings, agreement), name="upkeep"),
        ]
        settle_heap()
        try:
            yield
        finally:
            for chore in chores:
                chore.cancel()
            await asyncio.gather(*chores, return_exceptions=True)
            tracing.shutdown()
            if isinstance(app.state.service, FleetRollouts):
                app.state.service.shutting_down = True
            if listener is not None:
                await listener.stop()
            tools.shutdown()
            await store.aclose()

    app = FastAPI(title=f"Rollout Fleet gateway ({agent.name})", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, limit=settings.max_request_bytes)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    app.add_exception_handler(StoreFull, _store_full)
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    _routes(app, speaks_v1, api_key)
    app.add_middleware(metrics.CountAdmissions)  # counts every answer
    app.add_middleware(StartRefusalInOneLine)
    # outermost: refuses before anything starts
    app.add_middleware(
        OpenBindRefusal, has_key=api_key is not None, insecure_open=settings.insecure_open_gateway
    )
    if settings.tracing:
        tracing.setup("rollout-gateway", app)
    return app


__all__ = ["StartRefusalInOneLine", "create_app"]
