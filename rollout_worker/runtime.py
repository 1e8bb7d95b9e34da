"""Everything one worker process owns: opened when Celery's worker is built, started with it
and closed when it stops.

Every rollout runs on the process's event loop, taken there from the queue by the intake,
with one Redis pool and one HTTP pool shared by every rollout. Celery's worker, on the main
thread, drives this object as one of its bootsteps (``rollout_worker/celery_worker.py``):
``WorkerRuntime(...)`` opens the loop and connects (so a worker that cannot run rollouts
exits before Celery starts anything), :meth:`WorkerRuntime.start` starts the chores and the
watchdog, :meth:`WorkerRuntime.stop` winds down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from celery import Celery
from celery.worker import state as worker_state

from rollout_core.durability import Agreement, RedisWatch, SettingsKeeper, start_checks
from rollout_core.polling_clock import PollingClock
from rollout_core.protocols import cancelled_result
from rollout_core.queue.envelope import task_message
from rollout_core.secrets import SecretBox, check_key_canary, load_secret_box
from rollout_core.settings import FleetSettings
from rollout_core.store import Protocol, RecordKey, RecordStore, StoreError, WorkerBeat
from rollout_sdk.backend.sandboxed import SandboxedBackend, SandboxSettings
from rollout_sdk.client import HttpClientShards, observe_traingate_calls
from rollout_sdk.config import get_settings
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import Agent
from rollout_sdk.server.ownership import OwnershipLog, owner_from_env
from rollout_worker import metrics, v1, v2
from rollout_worker.chores import Chores, every
from rollout_worker.deadline import ExitDeadline
from rollout_worker.execution import Carrier, Executor
from rollout_worker.intake import TAKE_WAIT_SECONDS, Intake
from rollout_worker.loop import LoopThread
from rollout_worker.result_budget import ResultBudget
from rollout_worker.sandboxes import SandboxJanitor
from rollout_worker.slots import Slots
from rollout_worker.sweeper import Sweeper
from rollout_worker.task_events import OUTBOX
from rollout_worker.trajectories import TrajectorySink
from rollout_worker.watchdog import LoopWatchdog, Stall, TaskLineage

logger = logging.getLogger(__name__)

REVOKE_CHECK_SECONDS = 0.5
DURABILITY_CHECK_SECONDS = 10.0  # how often a worker asks whether Redis restarted
EXIT_LOOP_STALLED = 70  # EX_SOFTWARE: the supervisor restarts the worker
# Celery's consumer sends a heartbeat event every 2 s while it is connected and consuming.
CONSUMER_SILENCE_SECONDS = 10.0
STOP_LISTENER_RETRY_SECONDS = 1.0
# A stopping worker exits at most SHUTDOWN_GRACE + HAND_BACK + CLOSE seconds after SIGTERM,
# sooner when its rollouts end: after the grace, handing the rest back gets HAND_BACK_SECONDS;
# then Celery's own shutdown and ours get CLOSE_SECONDS (ExitDeadline).
HAND_BACK_SECONDS = 5.0
TRIAL_PRUNE_SECONDS = 60.0  # failed trials' folders outlive their retention by at most this
CLOSE_SECONDS = 5.0


def _carriers(
    agent: Agent,
    settings: FleetSettings,
    http: HttpClientShards,
    box: SecretBox,
    ownership: OwnershipLog,
    fleet: str,
) -> tuple[list[Carrier], Protocol]:
    """A carrier for each generation, and the one the agent speaks (the other only refuses)."""
    loop, bundle = (agent, None) if isinstance(agent, RolloutAgentLoop) else (None, agent)
    carriers: list[Carrier] = [
        v1.V1Carrier(
            loop,
            http,
            box,
            get_settings(),
            settings.record_ttl,
            settings.max_rollout_seconds,
            settings.debug_dir,
            ResultBudget.of_mb(settings.result_max_mb),
        ),
        v2.V2Carrier(
            bundle,
            box,
            settings.result_retention_seconds,
            settings.max_rollout_seconds,
            settings.token_ids,
            ownership,
            fleet=fleet,
            budget=ResultBudget.of_mb(settings.result_max_mb),
        ),
    ]
    return carriers, carriers[0].protocol if loop is not None else carriers[1].protocol


async def sandbox_fleet(store: RecordStore) -> str:
    """The fleet's name on a Docker engine: its key prefix and deployment id (a uuid kept in
    Redis), since fleets on other Redis databases or servers may share the prefix and the
    engine, and one must never judge another's sandboxes."""
    return f"{store.keys.prefix}@{await store.deployment_id(str(uuid.uuid4()))}"


def sandbox_settings(settings: FleetSettings) -> SandboxSettings:
    """The operator's ``sandbox_*`` settings, as a sandboxed backend takes them."""
    return SandboxSettings(
        slots=settings.sandbox_slots,
        build_network=settings.sandbox_build_network,
        egress=settings.sandbox_egress,
        log_retention_seconds=settings.result_retention_seconds,
        folder=settings.sandbox_dir,
        memory_mb=settings.sandbox_memory_mb,
        pids=settings.sandbox_pids,
        cpus=settings.sandbox_cpus,
        disk_mb=settings.sandbox_disk_mb,
        output_mb=settings.sandbox_output_mb,
        trials_mb=settings.sandbox_trials_mb,
        allowed_keys=frozenset(settings.sandbox_allow),
        task_roots=tuple(settings.sandbox_task_roots),
        task_hosts=frozenset(settings.sandbox_task_hosts),
        registries=frozenset(host.lower() for host in settings.sandbox_registries),
        build_hosts=frozenset(host.lower() for host in settings.sandbox_build_hosts),
    )


def sandbox_figures(agent: Agent) -> tuple[int, int]:
    """Sandboxes an agent's backend runs at most at once and runs now ((0, 0): none), also
    published as this process's metrics."""
    if not isinstance(agent, SandboxedBackend):
        return 0, 0
    found = agent.sandbox_figures()
    slots, running = int(found.get("slots", 0)), int(found.get("running", 0))
    metrics.SANDBOX_SLOTS.set(slots)
    metrics.SANDBOXES_RUNNING.set(running)
    return slots, running


@dataclass(frozen=True)
class _OnLoop:
    """What the worker's event loop owns: built on it, used only from it."""

    store: RecordStore
    http: HttpClientShards
    executor: Executor
    sweeper: Sweeper
    intake: Intake
    ownership: OwnershipLog
    fleet: str  # what this fleet's sandboxes are labelled with
    key_prints: list[str]  # the secret keys it holds, as its beats say (SecretBox.prints)

    @classmethod
    async def open(
        cls,
        settings: FleetSettings,
        app: Celery,
        agent: Agent,
        concurrency: int,
        worker: str,
        cancel_unstarted: Callable[[RecordKey], Awaitable[None]],
    ) -> _OnLoop:
        store = RecordStore.connect(settings)
        agreement = Agreement.of(store, settings, agent.name, admits=False)
        await start_checks(store, settings, agreement, admits=False)
        box = await load_secret_box(store, settings)
        await check_key_canary(store, box)
        http = HttpClientShards(concurrency, get_settings())
        # Upstream's OTLP ownership logs (OSMOSIS_ROLLOUT_OTLP_ENDPOINT), owned by this worker.
        ownership = OwnershipLog(owner_from_env(default_server_id=worker))
        ownership.start()
        if isinstance(agent, SandboxedBackend):  # it takes this worker's limits
            agent.configure(sandbox_settings(settings))
            await agent.check_engine()  # one line naming what is missing, before any rollout
        fleet = await sandbox_fleet(store)
        carriers, speaks = _carriers(agent, settings, http, box, ownership, fleet)

        def requeue_message(key: RecordKey) -> str:
            return task_message(app, key, store.keys.record_id(key), store.queue)

        sink = None
        if settings.trajectory_dir:
            sink = TrajectorySink(store, Path(settings.trajectory_dir), worker.replace(":", "-"))
        slots = Slots(concurrency)
        executor = Executor(store, worker, settings, carriers, speaks, requeue_message, slots, sink)
        intake = Intake(
            store,
            executor,
            slots,
            OUTBOX,
            worker_state.revoked,
            cancel_unstarted,
            requeue_message,
        )
        sweeper = Sweeper(store, requeue_message, settings)
        return cls(store, http, executor, sweeper, intake, ownership, fleet, box.prints)

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.store.aclose()
        await asyncio.to_thread(self.ownership.close)


class WorkerRuntime:
    """Opened on construction (the event loop, Redis, the carriers); :meth:`start` starts the
    chores and the watchdog."""

    def __init__(
        self, settings: FleetSettings, app: Celery, agent: Agent, concurrency: int
    ) -> None:
        self.settings = settings
        self.agent = agent
        self.concurrency = concurrency
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.ready = False
        self._app = app
        self._consumer_seen = -CONSUMER_SILENCE_SECONDS
        self._alive_file = Path(settings.worker_alive_file)
        self._stopping = False
        self._winding_down: concurrent.futures.Future[None] | None = None
        self._exit_deadline = ExitDeadline(self._last_words)
        self._metrics_server: WSGIServer | None = None
        self._chores: Chores | None = None
        self._loop = LoopThread()
        self._lineage = TaskLineage()
        self._lineage.install(self._loop.loop)
        self._loop.start()
        self._on_loop = self._loop.run(
            _OnLoop.open(settings, app, agent, concurrency, self.name, self._cancel_unstarted)
        )
        self._redis_watch = RedisWatch(self._on_loop.store, settings)
        agreement = Agreement.of(self._on_loop.store, settings, agent.name, admits=False)
        self._settings_keeper = SettingsKeeper(self._on_loop.store, settings, agreement)
        self._watchdog = LoopWatchdog(
            self._loop.loop,
            self._loop.thread,
            culprit=self._rollout_of,
            on_stall=self._recycle,
            limit=settings.loop_stall_limit,
        )

    def start(self) -> None:
        """Metrics, the chores (heartbeat, sweeper, stop listener, ...) and the watchdog; the
        intake starts taking rollouts once Celery's consumer is ready (:meth:`mark_ready`)."""
        observe_traingate_calls(metrics.observe_traingate_call)
        settings = self.settings
        self._metrics_server = self._serve_metrics(settings.metrics_port, settings.metrics_host)
        self._chores = self._loop.run(self._start_chores())
        self._watchdog.start()

    @staticmethod
    def _serve_metrics(port: int | None, host: str) -> WSGIServer | None:
        if port is None:
            return None
        try:
            server, _ = metrics.serve(port, host)
        except OSError:  # a second worker on this host: its metrics, not its rollouts, go
            logger.exception("no /metrics for this worker: port %d is taken", port)
            return None
        return server

    async def _start_chores(self) -> Chores:
        settings = self.settings
        return Chores(
            {
                "heartbeat": every(settings.lease_seconds / 3, self._heartbeat),
                "sweeper": every(settings.sweep_interval_seconds, self._on_loop.sweeper.sweep),
                "revoke-check": every(REVOKE_CHECK_SECONDS, self._cancel_revoked),
                "durability-check": every(DURABILITY_CHECK_SECONDS, self._check_durability),
                "stop-listener": self._listen_for_stops(),
                "polling-clock": PollingClock(self._on_loop.store).run(),
                **self._sandbox_chores(),
            }
        )

    def _sandbox_chores(self) -> dict[str, Coroutine[Any, Any, None]]:
        """With a sandboxed agent: the removal of sandboxes nobody owns (``sandboxes.py``)."""
        if not isinstance(self.agent, SandboxedBackend):
            return {}
        janitor = SandboxJanitor(
            self._on_loop.store, self.agent.engine, self._on_loop.fleet, self.settings
        )
        return {
            "sandbox-janitor": every(self.settings.sweep_interval_seconds, janitor.sweep),
            "sandbox-prewarm": self._prewarm(),
            "sandbox-logs": every(TRIAL_PRUNE_SECONDS, self._prune_trials),
        }

    async def _prune_trials(self) -> None:
        if isinstance(self.agent, SandboxedBackend):
            await self.agent.prune_trials()

    async def _prewarm(self) -> None:
        """Build the agent's sandbox images once, while the worker starts (a rollout that
        comes first waits for the same build rather than starting another)."""
        if not isinstance(self.agent, SandboxedBackend):
            return
        started = time.monotonic()
        try:
            await self.agent.prewarm()
        except Exception as exc:  # each rollout fails with the reason; the worker stays up
            logger.warning("sandbox images could not be built ahead: %s", exc)
            return
        logger.info("sandbox images ready in %.1fs", time.monotonic() - started)

    def stop(self) -> None:
        """Celery's worker has stopped: wait for the wind-down (rollouts finished or handed
        back), then close what the loop owns."""
        self.begin_shutdown()  # a stop without SIGTERM first (Celery's own shutdown)
        assert self._winding_down is not None
        try:
            budget = self.settings.shutdown_grace_seconds + HAND_BACK_SECONDS + TAKE_WAIT_SECONDS
            self._winding_down.result(budget)
        except Exception as exc:  # a timeout, or a wind-down that failed: close all the same
            logger.warning("stopping: the rollouts did not wind down (%r)", exc)
        if self._chores is not None:
            self._watchdog.stop()
        self._loop.run(self._close(), timeout=CLOSE_SECONDS)
        self._loop.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()

    async def _close(self) -> None:
        if self._chores is not None:
            await self._chores.stop()
        await asyncio.to_thread(self._alive_file.unlink, missing_ok=True)
        try:
            # Bounded: a Redis that does not answer would hold each try for its whole budget.
            async with asyncio.timeout(CLOSE_SECONDS / 2):
                await self._on_loop.store.forget_worker(self.name)
        except (StoreError, TimeoutError):
            logger.warning("could not withdraw this worker's heartbeat; it lapses by itself")
        await self._on_loop.aclose()

    def mark_ready(self) -> None:
        """Celery's consumer is running (revokes reach this worker): start taking rollouts,
        and announce this worker now rather than at the next beat."""
        self.ready = True
        self._loop.submit(self._on_loop.intake.start())
        self._loop.submit(self._heartbeat())

    def begin_shutdown(self) -> None:
        """SIGTERM: stop taking messages, let running rollouts finish for the grace period,
        hand the rest to other workers, and exit by a deadline whatever blocks (even if this
        loop is stuck: armed from here too)."""
        if self._stopping:
            return
        self._stopping = True
        grace = self.settings.shutdown_grace_seconds
        self._exit_deadline.arm(grace + HAND_BACK_SECONDS + CLOSE_SECONDS)
        self._winding_down = self._loop.submit(self._wind_down(grace))

    async def _wind_down(self, grace: float) -> None:
        intake, executor = self._on_loop.intake, self._on_loop.executor
        await intake.stop_taking()
        logger.warning(
            "stopping: %d rollouts running; those unfinished in %gs go to other workers",
            len(executor.leases),
            grace,
        )
        try:
            handed = await executor.hand_back(grace, HAND_BACK_SECONDS)
            await intake.drained()  # the last take's rollout: handed straight back
        finally:
            # Nothing left to wait for: Celery's shutdown and ours get CLOSE_SECONDS.
            self._exit_deadline.arm(CLOSE_SECONDS)
        if handed:
            logger.warning("stopping: handed %d rollouts back to the queue", handed)

    def _last_words(self) -> None:
        """Before a deadline ends the process: the liveness probe must not find it alive."""
        self._alive_file.unlink(missing_ok=True)

    async def _cancel_unstarted(self, key: RecordKey) -> None:
        """A revoked message taken before its rollout started: record the cancellation, and
        for v1 report it to the trainer, which would otherwise never hear."""
        store = self._on_loop.store
        result = cancelled_result(store.keys, key)
        await store.cancel({key: result}, self.settings.result_retention_seconds)
        await self._on_loop.executor.execute(key)  # a v1 rollout claims as cancelled, reports

    def _rollout_of(self, task: asyncio.Task[Any] | None) -> str | None:
        return self._lineage.root_in(task, self._on_loop.executor.running)

    def _recycle(self, stall: Stall) -> None:
        """On the watchdog thread, the loop stuck: fail the rollout that blocks it, give the
        others back to the queue and exit; the supervisor (compose's restart policy,
        ``rollout-fleet up``) starts a fresh worker."""
        reason = (
            f"the agent blocked its worker's event loop for over {stall.seconds:.3g}s (a "
            "blocking call in async code? run it with asyncio.to_thread); the worker was "
            "restarted"
        )
        logger.error(
            "recycling this worker: its event loop was blocked for %.1fs by rollout %s",
            stall.seconds,
            stall.key or "(none)",
        )
        try:
            asyncio.run(self._hand_back(stall.key, reason))
        except Exception:
            logger.exception("could not hand rollouts back; their leases lapse instead")
        finally:
            os._exit(EXIT_LOOP_STALLED)

    async def _hand_back(self, culprit: str | None, reason: str) -> None:
        """Runs on a loop of its own, with a Redis client of its own: the worker's are stuck.
        No callback goes out from here on (the loop may come unstuck meanwhile); one that went
        out ends its rollout here, since its answer may never be read, and a takeover would
        post it again."""
        departing = self._on_loop.executor.bar_posting()
        unstarted = self._on_loop.intake.taken.difference(d.key for d in departing)
        store = RecordStore.connect(self.settings, max_connections=2)
        try:
            for leaving in departing:
                key = leaving.key
                if leaving.posted:
                    await leaving.end_on_the_wire(store, self.settings)
                    continue
                abandon = reason if key == culprit else ""
                message = self._message(store, key)
                await store.hand_back(key, leaving.execution, message, abandon, unposted=True)
            for key in unstarted:
                await store.hand_back(key, "", self._message(store, key))
            await store.forget_worker(self.name)
        finally:
            await store.aclose()

    def _message(self, store: RecordStore, key: RecordKey) -> str:
        return task_message(self._app, key, store.keys.record_id(key), store.queue)

    async def _heartbeat(self) -> None:
        executor = self._on_loop.executor
        await executor.renew_leases()
        if not self.ready:
            return
        slots, sandboxes = sandbox_figures(self.agent)
        beat = WorkerBeat(
            worker=self.name,
            pid=os.getpid(),
            concurrency=self.concurrency,
            inflight=len(executor.leases),
            at=await self._on_loop.store.clock(),
            sandbox_slots=slots,
            sandboxes=sandboxes,
            keys=self._on_loop.key_prints,
        )
        await self._on_loop.store.beat(beat, max(3, int(self.settings.lease_seconds)))
        await self._settings_keeper.keep()
        if self.consuming():
            await asyncio.to_thread(self._alive_file.touch)

    def consumer_beat(self) -> None:
        """Celery's consumer sent a heartbeat event: its loop turns and the broker answers."""
        self._consumer_seen = time.monotonic()

    def consuming(self) -> bool:
        """Celery's consumer beats (revokes reach this worker) and the intake takes work."""
        fresh = time.monotonic() - self._consumer_seen < CONSUMER_SILENCE_SECONDS
        return fresh and self._on_loop.intake.alive()

    async def _check_durability(self) -> None:
        """Whether Redis, restarted, can now lose rollouts: logged once (``RedisWatch``). A
        Redis that does not answer is the other chores' to report."""
        with contextlib.suppress(StoreError):
            await self._redis_watch.data_loss()

    async def _cancel_revoked(self) -> None:
        """Flower's Revoke (and ``celery control revoke``) cancels that rollout's task only."""
        for key in self._on_loop.executor.cancel_revoked(worker_state.revoked):
            logger.warning("%s: revoked; cancelling its execution", key)

    async def _listen_for_stops(self) -> None:
        """Stop requests (cancel, polling lease expiry) for rollouts running here."""
        store, executor = self._on_loop.store, self._on_loop.executor
        while True:
            try:
                async with store.stop_requests() as stops:
                    async for key in stops:
                        if executor.cancel(key):
                            logger.info("%s: stop requested; cancelling its execution", key)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("stop listener lost Redis; reconnecting")
                await asyncio.sleep(STOP_LISTENER_RETRY_SECONDS)


__all__ = ["WorkerRuntime"]
