"""The Celery side of a worker: its lifecycle signals, which start and stop the runtime.

Celery's worker consumes no queue here (``rollout-fleet worker`` excludes the rollout queue):
the runtime's intake takes the ``rollout.run`` messages on the event loop
(``rollout_worker/intake.py``). Celery keeps what it is good at: remote control (revokes),
heartbeats, and the task events Flower shows, which the intake hands it
(``rollout_worker/task_events.py``). ``--concurrency`` is the rollouts in flight per process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import signals

from rollout_core import logs, tracing
from rollout_core.queue.celery_app import app, settings
from rollout_sdk.loader import AgentLoadError, load_agent
from rollout_sdk.server.http import settle_heap
from rollout_worker import task_events
from rollout_worker.runtime import WorkerRuntime

logger = logging.getLogger(__name__)
task_events.install(app)

_runtime: WorkerRuntime | None = None


@signals.setup_logging.connect
def _configure_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Ours instead of Celery's: the fleet's format, with each line's rollout."""
    level = logging.getLevelName(loglevel) if isinstance(loglevel, int) else loglevel
    logs.configure(level or settings.log_level, settings.log_format)


@signals.worker_init.connect
def _start_runtime(sender: Any = None, **_: Any) -> None:
    global _runtime  # noqa: PLW0603 - one runtime per worker process
    if not settings.agent:
        raise SystemExit("no agent configured: set AGENT (or ROLLOUT_FLEET_AGENT) to module:attr")
    try:
        agent = load_agent(settings.agent)
    except AgentLoadError as exc:
        raise SystemExit(f"cannot load the agent {settings.agent!r}: {exc}") from exc
    if settings.tracing:
        tracing.setup("rollout-worker")
    concurrency = getattr(sender, "concurrency", None) or settings.concurrency
    try:
        runtime = WorkerRuntime(settings, app, agent, concurrency)
    except Exception as exc:
        # Celery only logs exceptions raised by signal handlers; a worker that cannot run
        # rollouts must exit instead of consuming them.
        raise SystemExit(f"the worker cannot start: {type(exc).__name__}: {exc}") from exc
    _runtime = runtime
    settle_heap()
    logger.info("worker %s serving agent %r (%d slots)", runtime.name, agent.name, concurrency)


@signals.worker_ready.connect
def _mark_ready(**_: Any) -> None:
    if _runtime is not None:
        _runtime.mark_ready()


@signals.heartbeat_sent.connect
def _consumer_beat(**_: Any) -> None:
    if _runtime is not None:
        _runtime.consumer_beat()


@signals.worker_shutting_down.connect
def _hand_back(**_: Any) -> None:
    if _runtime is not None:
        _runtime.begin_shutdown()


@signals.worker_shutdown.connect
def _stop_runtime(**_: Any) -> None:
    if _runtime is not None:
        _runtime.stop()
    tracing.shutdown()


def run_worker(argv: Sequence[str]) -> None:
    """Run a Celery worker of the fleet's app, with the signals above connected."""
    app.worker_main(list(argv))
