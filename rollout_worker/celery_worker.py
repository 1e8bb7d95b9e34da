"""The Celery worker of a worker process: the fleet's logging, and the runtime as a bootstep.

Celery's worker consumes no queue here (``rollout-fleet worker`` excludes the rollout queue):
the runtime's intake takes the ``rollout.run`` messages on the event loop
(``rollout_worker/intake.py``). Celery keeps what it is good at: remote control (revokes),
heartbeats, and the task events Flower shows, which the intake hands it
(``rollout_worker/task_events.py``). The runtime is one of the worker's bootsteps
(:class:`RuntimeStep`): Celery creates it with the worker, starts it before its consumer and
stops it after, so its lifetime is the worker's and nothing of it lives in a module global.
``--concurrency`` is the rollouts in flight per process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import bootsteps, signals
from celery.worker import WorkController

from rollout_core import logs, tracing
from rollout_core.queue.celery_app import app, settings
from rollout_sdk.loader import AgentLoadError, load_agent
from rollout_sdk.server.heap import settle_heap
from rollout_worker import task_events
from rollout_worker.runtime import WorkerRuntime

logger = logging.getLogger(__name__)


class RuntimeStep(bootsteps.StartStopStep):
    """The worker's :class:`WorkerRuntime`: created with Celery's worker (a worker that cannot
    run rollouts exits there, with one line), started before the consumer, stopped after it.

    Celery's signals that tell the runtime about the consumer (ready, heartbeats) and about a
    SIGTERM (which must stop the intake at once, before Celery's own shutdown reaches this
    step) are connected while the step runs."""

    label = "Rollout runtime"

    def __init__(self, parent: WorkController, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.runtime: WorkerRuntime | None = None

    def create(self, parent: WorkController) -> None:
        if not settings.agent:
            raise SystemExit(
                "no agent configured: set AGENT (or ROLLOUT_FLEET_AGENT) to module:attr"
            )
        try:
            agent = load_agent(settings.agent)
        except AgentLoadError as exc:
            raise SystemExit(f"cannot load the agent {settings.agent!r}: {exc}") from exc
        if settings.tracing:
            tracing.setup("rollout-worker")
        concurrency = getattr(parent, "concurrency", None) or settings.concurrency
        try:
            runtime = WorkerRuntime(settings, app, agent, concurrency)
        except Exception as exc:
            # A worker that cannot run rollouts must exit instead of taking them.
            raise SystemExit(f"the worker cannot start: {type(exc).__name__}: {exc}") from exc
        settle_heap()
        logger.info("worker %s serving agent %r (%d slots)", runtime.name, agent.name, concurrency)
        self.runtime = runtime

    def start(self, parent: WorkController) -> None:
        runtime = self.runtime
        if runtime is None:
            return
        signals.worker_ready.connect(self._ready, weak=False)
        signals.heartbeat_sent.connect(self._consumer_beat, weak=False)
        signals.worker_shutting_down.connect(self._shutting_down, weak=False)
        runtime.start()

    def stop(self, parent: WorkController) -> None:
        runtime = self.runtime
        if runtime is None:
            return
        self.runtime = None
        runtime.stop()
        for signal, receiver in (
            (signals.worker_ready, self._ready),
            (signals.heartbeat_sent, self._consumer_beat),
            (signals.worker_shutting_down, self._shutting_down),
        ):
            signal.disconnect(receiver)
        tracing.shutdown()

    def terminate(self, parent: WorkController) -> None:
        """Celery's cold shutdown: the same wind-down, bounded by the runtime's exit deadline."""
        self.stop(parent)

    def _ready(self, **_: Any) -> None:
        if self.runtime is not None:
            self.runtime.mark_ready()

    def _consumer_beat(self, **_: Any) -> None:
        if self.runtime is not None:
            self.runtime.consumer_beat()

    def _shutting_down(self, **_: Any) -> None:
        if self.runtime is not None:
            self.runtime.begin_shutdown()


@signals.setup_logging.connect
def _configure_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Ours instead of Celery's: the fleet's format, with each line's rollout."""
    level = logging.getLevelName(loglevel) if isinstance(loglevel, int) else loglevel
    logs.configure(level or settings.log_level, settings.log_format)


task_events.install(app)
app.steps["worker"].add(RuntimeStep)


def run_worker(argv: Sequence[str]) -> None:
    """Run a Celery worker of the fleet's app, with the runtime as one of its bootsteps."""
    app.worker_main(list(argv))


__all__ = ["RuntimeStep", "run_worker"]
