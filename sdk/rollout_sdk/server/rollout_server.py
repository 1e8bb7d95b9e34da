"""``create_rollout_server``: a v2 rollout server in one process (SDK.md §2.9).

Rollouts run as asyncio tasks on the given backend; results, leases and retention live in
memory. For local development, and as the fleet's in-process baseline. The fleet gateway
serves the same routes (``v2_http``) with all state in Redis.

As upstream's server, it reports each rollout's status changes as OTLP ownership logs when
``OSMOSIS_ROLLOUT_OTLP_ENDPOINT`` is set (``ownership``), writes live previews when
``_OSMOSIS_ROLLOUT_PREVIEW_ROOT`` is set (``trajectory.preview``), and archives each
rollout's trajectory (``trajectory.save``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.backend.errors import categorize_exception
from rollout_sdk.context import RolloutContext, RolloutProgress
from rollout_sdk.server.auth import require_bearer
from rollout_sdk.server.capture import BackendCaptured, capturing
from rollout_sdk.server.http import install_error_handlers, settle_heap
from rollout_sdk.server.lease import LeaseManager, UnknownLeaseError, new_lease_token
from rollout_sdk.server.ownership import OwnershipLog
from rollout_sdk.server.result_registry import (
    DuplicateRolloutError,
    UnknownRolloutError,
    check_timeouts,
)
from rollout_sdk.server.v2_http import QueueFull, RolloutService, ServerDraining, v2_router
from rollout_sdk.trajectory.preview import preview_root, publish_previews
from rollout_sdk.trajectory.save import save_trajectory
from rollout_sdk.types.protocol import (
    DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    DEFAULT_RESULT_RETENTION_SEC,
    DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    CancelDisposition,
    CancelRolloutsRequest,
    DrainResponse,
    HealthConcurrency,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutLifecycle,
    RolloutResultResponse,
    RolloutServerHealth,
    cancelled_result,
    failure_result,
    lease_expired_result,
    wire_result,
)
from rollout_sdk.types.sample import RolloutStatus

logger = logging.getLogger(__name__)

INSTANCE_ID_ENV = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
SHUTDOWN_DRAIN_SEC = 10.0
SHUTDOWN_CLEANUP_SEC = 120.0


@dataclass
class _Entry:
    rollout_id: str
    progress: RolloutProgress = field(default_factory=RolloutProgress)
    result: RolloutResultResponse | None = None
    task: asyncio.Task[None] | None = None
    disposition: CancelDisposition | None = None


class InProcessRollouts(RolloutService):
    """Rollouts of one process, on an :class:`ExecutionBackend`."""

    def __init__(
        self,
        backend: ExecutionBackend,
        *,
        result_wait_timeout_sec: float,
        polling_lease_timeout_sec: float,
        result_retention_sec: float,
    ) -> None:
        self.backend = backend
        self.wait_sec = result_wait_timeout_sec
        self.lease_sec = polling_lease_timeout_sec
        self.retention_sec = result_retention_sec
        self.process_id = str(uuid.uuid4())
        self.instance_id = os.environ.get(INSTANCE_ID_ENV) or self.process_id
        self.accepting = True
        self.entries: dict[str, _Entry] = {}
        self.leases = LeaseManager(timeout_sec=polling_lease_timeout_sec, on_expired=self._expire)
        self._background: set[asyncio.Task[Any]] = set()
        self.ownership = OwnershipLog()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # --- admission and execution --------------------------------------------------------

    async def admit(self, request: RolloutInitRequest) -> RolloutInitResponse:
        if not self.accepting:
            raise ServerDraining
        if not self.backend.has_capacity():
            raise QueueFull
        if request.rollout_id in self.entries:
            raise DuplicateRolloutError(request.rollout_id)
        token = new_lease_token()
        entry = _Entry(request.rollout_id)
        self.entries[request.rollout_id] = entry
        self.leases.register(request.rollout_id, token)
        owned = self.ownership.fields(request.rollout_id, request.metadata)

        async def report(status: RolloutStatus) -> None:
            self.ownership.record(owned, status)

        # Every later change (running, grading, the result: also a cancel or an expired
        # lease) goes through the progress.
        entry.progress.on_status = report
        self.ownership.record(owned, RolloutStatus.QUEUED)
        entry.task = asyncio.create_task(self._run(request, entry))
        return RolloutInitResponse(
            rollout_id=request.rollout_id,
            status=RolloutStatus.QUEUED,
            polling_lease_token=token,
            result_wait_timeout_sec=self.wait_sec,
            polling_lease_timeout_sec=self.lease_sec,
        )

    async def _run(self, request: RolloutInitRequest, entry: _Entry) -> None:
        await entry.progress.set_status(RolloutStatus.RUNNING)
        ctx = RolloutContext(
            chat_completions_url=request.chat_completions_url,
            api_key=request.llm_api_key,
            rollout_id=request.rollout_id,
            progress=entry.progress,
        )
        root = preview_root(request.rollout_id)
        if root is not None:
            self._spawn(publish_previews(ctx, entry.progress, root))
        execution = request.execution_request()
        try:
            with ctx:
                outcome = await self.backend.execute(execution)
            response = wire_result(request.rollout_id, outcome.result)
            archived = outcome.result_to_save
            await save_trajectory(
                rollout_id=request.rollout_id,
                result=archived,
                request_label=request.label,
                request_metadata=request.metadata,
                request_extra_fields=request.extra_fields,
                diagnostics=archived.extra_fields,
            )
        except asyncio.CancelledError:
            await self._finish(entry, cancelled_result(request.rollout_id))
            raise
        except Exception as exc:
            logger.exception("rollout %s crashed", request.rollout_id)
            message = str(exc) or "Internal server error"
            response = failure_result(request.rollout_id, message, categorize_exception(exc))
        await self._finish(entry, response)

    async def _finish(self, entry: _Entry, response: RolloutResultResponse) -> None:
        """Publish the result once; a late result after lease expiry is discarded."""
        if entry.result is not None:
            return
        try:
            expired = self.leases.expired(entry.rollout_id)
        except UnknownLeaseError:  # the leases were closed: a rollout outlived shutdown
            expired = False
        if expired:
            response = lease_expired_result(entry.rollout_id)
            self._stop(entry)
        self.leases.finish(entry.rollout_id)
        entry.result = response
        await entry.progress.set_status(response.status)
        self._spawn(self._evict_after_retention(entry))

    async def _evict_after_retention(self, entry: _Entry) -> None:
        await asyncio.sleep(self.retention_sec)
        if entry.task is not None:
            await asyncio.wait({entry.task})  # the id stays reserved until execution stopped
        if self.entries.get(entry.rollout_id) is entry:
            del self.entries[entry.rollout_id]
            self.leases.remove(entry.rollout_id)

    def _stop(self, entry: _Entry) -> CancelDisposition:
        if entry.disposition is None:
            queued = entry.progress.status is RolloutStatus.QUEUED
            entry.disposition = (
                CancelDisposition.CANCELLED_QUEUED
                if queued
                else CancelDisposition.CANCELLED_RUNNING
            )
        task = entry.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
        return entry.disposition

    # --- polling ------------------------------------------------------------------------

    def _entry(self, rollout_id: str, token: str) -> _Entry:
        entry = self.entries.get(rollout_id)
        if entry is None:
            raise UnknownRolloutError(rollout_id)
        self.leases.authenticate(rollout_id, token)
        return entry

    async def poll(self, rollout_id: str, lease_token: str) -> RolloutResultResponse:
        entry = self._entry(rollout_id, lease_token)
        if entry.result is None:
            if not self.leases.renew(rollout_id, lease_token):
                await self._finish(entry, lease_expired_result(rollout_id))
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.wait_sec):
                        await entry.progress.wait_for_change()
        entry = self._entry(rollout_id, lease_token)
        return entry.result or RolloutResultResponse(
            rollout_id=rollout_id, status=entry.progress.status
        )

    async def _expire(self, rollout_id: str) -> None:
        """Nobody polled in time: finish (and stop) the rollout without waiting for a poll."""
        entry = self.entries.get(rollout_id)
        if entry is not None and entry.result is None:
            await self._finish(entry, lease_expired_result(rollout_id))

    # --- cancel, health, drain ----------------------------------------------------------

    async def cancel(self, request: CancelRolloutsRequest) -> dict[str, CancelDisposition]:
        if request.all:
            selected = list(self.entries)
        elif request.prefix is not None:
            selected = [rid for rid in self.entries if rid.startswith(request.prefix)]
        else:
            selected = list(request.ids or [])
        dispositions = {}
        for rollout_id in selected:
            entry = self.entries.get(rollout_id)
            running = entry is not None and entry.result is None
            dispositions[rollout_id] = (
                self._stop(entry) if entry and running else CancelDisposition.NOT_FOUND
            )
        return dispositions

    def _active(self) -> list[str]:
        return [e.rollout_id for e in self.entries.values() if e.task and not e.task.done()]

    async def health(self) -> RolloutServerHealth:
        backend = self.backend.health()
        concurrency = backend.get("concurrency") or {}
        return RolloutServerHealth(
            status=backend.get("status", "ok"),
            concurrency=HealthConcurrency(
                max_concurrent=concurrency.get("max_concurrent"),
                queued=concurrency.get("queued", 0),
                running=concurrency.get("running", 0),
            ),
            instance_id=self.instance_id,
            process_id=self.process_id,
            lifecycle=RolloutLifecycle(
                accepting_rollouts=self.accepting, active_rollouts=len(self._active())
            ),
        )

    async def drain(self, timeout_sec: float) -> DrainResponse:
        self.accepting = False
        tasks = [e.task for e in self.entries.values() if e.task and not e.task.done()]
        if tasks and timeout_sec > 0:
            await asyncio.wait(tasks, timeout=timeout_sec)
        active = self._active()
        return DrainResponse(
            drained=not active,
            accepting_rollouts=False,
            active_rollouts=len(active),
            process_id=self.process_id,
            rollout_ids=active,
        )

    async def resume(self) -> RolloutLifecycle:
        self.accepting = True
        return RolloutLifecycle(accepting_rollouts=True, active_rollouts=len(self._active()))

    async def shutdown(self) -> None:
        """Stop admitting, let in-flight rollouts finish briefly, cancel the rest (P§2.14)."""
        await self.drain(SHUTDOWN_DRAIN_SEC)
        leftovers = [e for e in self.entries.values() if e.task and not e.task.done()]
        for entry in leftovers:
            self._stop(entry)
        tasks = [e.task for e in leftovers if e.task]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_CLEANUP_SEC)
        await self.leases.close()
        for task in self._background:
            task.cancel()


def create_rollout_server(
    *,
    backend: ExecutionBackend,
    lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[Any]] | None = None,
    configure_logging: bool = True,
    result_wait_timeout_sec: float = DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    polling_lease_timeout_sec: float = DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    result_retention_sec: float = DEFAULT_RESULT_RETENTION_SEC,
    api_key: str | None = None,
) -> FastAPI:
    """Serve ``backend`` with the v2 poll/lease protocol from this process."""
    if capturing():  # a fleet worker is taking the backend out of main() (capture.py)
        raise BackendCaptured(backend, lifespan)
    check_timeouts(result_wait_timeout_sec, polling_lease_timeout_sec, result_retention_sec)
    if configure_logging and not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    service = InProcessRollouts(
        backend,
        result_wait_timeout_sec=result_wait_timeout_sec,
        polling_lease_timeout_sec=polling_lease_timeout_sec,
        result_retention_sec=result_retention_sec,
    )

    @contextlib.asynccontextmanager
    async def server_lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if lifespan is not None:
                await stack.enter_async_context(lifespan(app))
            settle_heap()
            service.ownership.start()
            try:
                yield
            finally:
                await service.shutdown()
                await backend.shutdown()
                await asyncio.to_thread(service.ownership.close)

    app = FastAPI(title="Rollout server", lifespan=server_lifespan)
    app.state.backend = backend
    app.state.rollouts = service
    install_error_handlers(app)
    if api_key is not None:
        require_bearer(app, api_key)
    app.include_router(v2_router(lambda request: service))
    return app


__all__ = ["InProcessRollouts", "create_rollout_server"]
