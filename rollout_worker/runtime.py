"""Everything one worker process owns, built when the worker starts and closed when it stops.

The Celery task threads only call :meth:`WorkerRuntime.run_rollout`; all I/O happens on the
process's event loop, with one Redis pool and one HTTP pool shared by every rollout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from celery import Celery
from celery.worker import state as worker_state
from redis.asyncio import Redis
from redis.exceptions import RedisError

from rollout_sdk.client import HttpClientShards, observe_traingate_calls
from rollout_sdk.config import get_settings
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import Agent
from rollout_worker import metrics, v1, v2
from rollout_worker.envelope import task_id_for, task_message
from rollout_worker.execution import Carrier, Executor
from rollout_worker.loop import LoopThread
from rollout_worker.records import RecordStore, connect
from rollout_worker.secrets import load_secret_box
from rollout_worker.settings import FleetSettings
from rollout_worker.sweeper import Sweeper
from rollout_worker.trajectories import TrajectorySink
from rollout_worker.watchdog import LoopWatchdog, Stall, TaskLineage

logger = logging.getLogger(__name__)

REVOKE_CHECK_SECONDS = 0.5
EXIT_LOOP_STALLED = 70  # EX_SOFTWARE: the supervisor restarts the worker
# Celery's consumer sends a heartbeat event every 2 s while it is connected and consuming.
CONSUMER_SILENCE_SECONDS = 10.0
BACKGROUND_STOP_SECONDS = 2.0


class WorkerRuntime:
    def __init__(
        self, settings: FleetSettings, app: Celery, agent: Agent, concurrency: int
    ) -> None:
        self.settings = settings
        self.app = app
        self.agent = agent
        self.concurrency = concurrency
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.ready = False
        self._consumer_seen = -CONSUMER_SILENCE_SECONDS
        self._alive_file = Path(settings.worker_alive_file)
        self._loop = LoopThread()
        self._lineage = TaskLineage()
        self._watchdog: LoopWatchdog | None = None
        self._waiting: set[str] = set()  # rollouts pool threads handed to the loop
        self._waiting_lock = threading.Lock()
        self._requeue_message: Callable[[str], str] | None = None
        self._background: list[asyncio.Task[None]] = []
        self._redis: Redis | None = None
        self._http: HttpClientShards | None = None
        self._executor: Executor | None = None
        self._metrics_server: tuple[WSGIServer, threading.Thread] | None = None

    def start(self) -> None:
        observe_traingate_calls(metrics.observe_traingate_call)
        port = self.settings.metrics_port
        if port is not None:
            try:
                self._metrics_server = metrics.serve(port)
            except OSError:  # a second worker on this host: its metrics, not its rollouts, go
                logger.exception("no /metrics for this worker: port %d is taken", port)
        self._lineage.install(self._loop.loop)
        self._loop.start()
        self._loop.run(self._open())
        self._watchdog = LoopWatchdog(
            self._loop.loop,
            self._loop.thread,
            culprit=self._rollout_of,
            on_stall=self._recycle,
            limit=self.settings.loop_stall_limit,
        )
        self._watchdog.start()

    def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        self._loop.run(self._close(), timeout=30)
        self._loop.stop()
        if self._metrics_server is not None:
            self._metrics_server[0].shutdown()

    def mark_ready(self) -> None:
        """The consumer is running: announce this worker now rather than at the next beat."""
        self.ready = True
        self._loop.submit(self._heartbeat())

    def begin_shutdown(self) -> None:
        """SIGTERM: Celery stops consuming and waits for running tasks; make that wait short
        by handing unfinished rollouts to other workers after the grace period."""
        self._loop.submit(self._hand_back())

    async def _hand_back(self) -> None:
        assert self._executor is not None
        grace = self.settings.shutdown_grace_seconds
        logger.warning(
            "stopping: %d rollouts running; those unfinished in %gs go to other workers",
            len(self._executor.held),
            grace,
        )
        handed = await self._executor.hand_back(grace)
        if handed:
            logger.warning("stopping: handed %d rollouts back to the queue", handed)

    def cancel_unstarted(self, record: str) -> None:
        """Celery discarded this rollout's message (revoked before it started): record the
        cancellation, and for v1 report it to the trainer, which would otherwise never hear."""
        self._loop.submit(self._cancel_unstarted(record))

    async def _cancel_unstarted(self, record: str) -> None:
        assert self._executor is not None
        retention_ms = int(self.settings.result_retention_seconds * 1000)
        await self._executor.store.cancel([record], retention_ms)
        await self._executor.execute(record)  # a v1 rollout claims as cancelled and reports

    def run_rollout(self, record: str) -> str:
        """Called on a Celery pool thread: run the rollout on the loop and wait for it."""
        assert self._executor is not None
        with self._waiting_lock:
            self._waiting.add(record)
        try:
            return self._loop.run(self._executor.execute(record))
        finally:
            with self._waiting_lock:
                self._waiting.discard(record)

    def _rollout_of(self, task: asyncio.Task[Any] | None) -> str | None:
        assert self._executor is not None
        return self._lineage.root_in(task, self._executor.running)

    def _recycle(self, stall: Stall) -> None:
        """On the watchdog thread, the loop stuck: fail the rollout that blocks it, give the
        others back to the queue and exit; the supervisor (compose's restart policy,
        ``rollout-fleet up``) starts a fresh worker."""
        reason = (
            f"the agent blocked its worker's event loop for over {stall.seconds:.0f}s (a "
            "blocking call in async code? run it with asyncio.to_thread); the worker was "
            "restarted"
        )
        logger.error(
            "recycling this worker: its event loop was blocked for %.1fs by rollout %s",
            stall.seconds,
            stall.record or "(none)",
        )
        try:
            asyncio.run(self._give_back(stall.record, reason))
        except Exception:
            logger.exception("could not give rollouts back; their leases lapse instead")
        finally:
            os._exit(EXIT_LOOP_STALLED)

    async def _give_back(self, culprit: str | None, reason: str) -> None:
        """Runs on a loop of its own, with a Redis client of its own: the worker's are stuck."""
        assert self._executor is not None
        assert self._requeue_message is not None
        held = self._executor.leases
        with self._waiting_lock:
            unstarted = self._waiting.difference(held)
        redis = connect(self.settings.redis_dsn, 2)
        try:
            store = RecordStore(redis, self.settings.key_prefix, self.settings.queue)
            for record, owner in held.items():
                abandon = reason if record == culprit else ""
                await store.release(record, owner, self._requeue_message(record), abandon)
            for record in unstarted:
                await store.release(record, "", self._requeue_message(record))
            await store.forget_worker(self.owner)
        finally:
            await redis.aclose()

    async def _open(self) -> None:
        settings = self.settings
        self._redis = connect(settings.redis_dsn, settings.redis_max_connections)
        store = RecordStore(self._redis, settings.key_prefix, settings.queue)
        box = await load_secret_box(self._redis, settings)
        sdk_settings = get_settings()
        self._http = HttpClientShards(self.concurrency, sdk_settings)
        carrier: Carrier
        if isinstance(self.agent, RolloutAgentLoop):
            carrier = v1.V1Carrier(
                self.agent,
                self._http,
                box,
                sdk_settings,
                settings.record_ttl,
                settings.max_rollout_seconds,
                settings.debug_dir,
            )
            protocol = v1.PROTOCOL
        else:
            carrier = v2.V2Carrier(
                self.agent, box, settings.result_retention_seconds, settings.max_rollout_seconds
            )
            protocol = v2.PROTOCOL

        def requeue_message(record: str) -> str:
            return task_message(self.app, record, store.keys.rollout_key(record), store.queue)

        self._requeue_message = requeue_message

        sink = None
        if settings.trajectory_dir:
            name = self.owner.replace(":", "-")
            sink = TrajectorySink(store, Path(settings.trajectory_dir), name)
        self._executor = Executor(
            store,
            self.owner,
            settings,
            {protocol: carrier},
            self.concurrency,
            requeue_message,
            sink,
        )
        sweeper = Sweeper(store, requeue_message, settings)
        self._background = [
            asyncio.create_task(
                self._every(settings.lease_seconds / 3, self._heartbeat), name="heartbeat"
            ),
            asyncio.create_task(
                self._every(settings.sweep_interval_seconds, sweeper.sweep), name="sweeper"
            ),
            asyncio.create_task(
                self._every(REVOKE_CHECK_SECONDS, self._cancel_revoked), name="revoke-check"
            ),
            asyncio.create_task(self._listen_for_stops(store.keys.stops), name="stop-listener"),
        ]

    async def _close(self) -> None:
        for task in self._background:
            task.cancel()
        # Bounded: a cancellation swallowed inside a library call (seen in a sweep's Redis
        # call, about one stop in ten) would otherwise keep its chore looping and this
        # worker from exiting until SIGKILL.
        ignored: set[asyncio.Task[None]] = set()
        if self._background:
            _, ignored = await asyncio.wait(self._background, timeout=BACKGROUND_STOP_SECONDS)
        for task in ignored:
            logger.warning("stopping: %s ignored its cancellation; left behind", task.get_name())
        await asyncio.to_thread(self._alive_file.unlink, missing_ok=True)
        if self._executor is not None:
            try:
                await self._executor.store.forget_worker(self.owner)
            except RedisError:
                logger.warning("could not withdraw this worker's heartbeat; it lapses by itself")
        if self._http is not None:
            await self._http.aclose()
        if self._redis is not None:
            await self._redis.aclose()

    async def _heartbeat(self) -> None:
        assert self._executor is not None
        await self._executor.renew_leases()
        if not self.ready:
            return
        status = {
            "owner": self.owner,
            "pid": os.getpid(),
            "concurrency": self.concurrency,
            "inflight": len(self._executor.held),
            "at": time.time(),
        }
        await self._executor.store.beat(
            self.owner, status, max(3, int(self.settings.lease_seconds))
        )
        if self.consuming():
            await asyncio.to_thread(self._alive_file.touch)

    def consumer_beat(self) -> None:
        """Celery's consumer sent a heartbeat event: its loop turns and the broker answers."""
        self._consumer_seen = time.monotonic()

    def consuming(self) -> bool:
        return time.monotonic() - self._consumer_seen < CONSUMER_SILENCE_SECONDS

    async def _cancel_revoked(self) -> None:
        """Flower's Revoke (and ``celery control revoke``) cancels that rollout's task only."""
        assert self._executor is not None
        revoked = worker_state.revoked
        for record in self._executor.held:
            if task_id_for(record) in revoked and self._executor.cancel(record):
                logger.warning("%s: revoked; cancelling its execution", record)

    async def _listen_for_stops(self, channel: str) -> None:
        """Stop requests (cancel, poll lease expiry) for rollouts running here."""
        assert self._redis is not None
        assert self._executor is not None
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    async for message in pubsub.listen():
                        if message["type"] == "message" and self._executor.cancel(message["data"]):
                            logger.info(
                                "%s: stop requested; cancelling its execution", message["data"]
                            )
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("stop listener lost Redis; reconnecting")
                await asyncio.sleep(1)

    @staticmethod
    async def _every(interval: float, action: Callable[[], Awaitable[object]]) -> None:
        while True:
            try:
                await action()
            except Exception:
                logger.exception("%s failed; retrying in %.1fs", action.__qualname__, interval)
            await asyncio.sleep(interval)


__all__ = ["WorkerRuntime"]
