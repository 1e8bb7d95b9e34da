"""The Celery side of a worker: the ``rollout.run`` task and the process lifecycle signals.

The task is a thin synchronous wrapper: it hands the record key to the process's event
loop and waits, so Celery's ``--concurrency`` caps the rollouts in flight per process.
Importing this module registers the task on the fleet's Celery app (``rollout-fleet worker``
does, before it starts the worker).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Sequence
from typing import Any

from celery import Task, signals
from celery.exceptions import Reject

from rollout_core import logs, tracing
from rollout_core.queue.celery_app import app, settings
from rollout_core.queue.envelope import TASK_NAME
from rollout_core.store import Keys, RecordKey, StoreError
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


# A pool thread runs one task at a time: the rollout its log lines name, while it runs.
_naming = threading.local()


@signals.task_prerun.connect
def _name_rollout(args: Any = None, **_: Any) -> None:
    """Celery's own lines about a task (its outcome) name the task's rollout."""
    if args:
        _naming.token = logs.begin(Keys(settings.key_prefix).record_id(args[0]))


@signals.task_postrun.connect
def _unname_rollout(**_: Any) -> None:
    token = getattr(_naming, "token", None)
    if token is not None:
        _naming.token = None
        logs.end(token)


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


@signals.task_revoked.connect
def _revoked(request: Any = None, **_: Any) -> None:
    """A revoked message is dropped unexecuted; the record must not stay queued forever."""
    args = getattr(request, "args", None)
    if _runtime is not None and args and getattr(request, "task", None) == TASK_NAME:
        _runtime.cancel_unstarted(RecordKey(args[0]))


@app.task(name=TASK_NAME, bind=True)
def run_rollout(self: Task[Any, str], key: str) -> str:
    if _runtime is None:
        raise RuntimeError("the worker runtime is not running")
    try:
        return _runtime.run_rollout(RecordKey(key), self.request.id or "")
    except (asyncio.CancelledError, concurrent.futures.CancelledError):
        return "cancelled"
    except StoreError as exc:
        # Acking now could lose a rollout whose claim never reached Redis; put the message
        # back (a duplicate delivery is harmless: the claim sorts it out).
        raise Reject(f"Redis unavailable ({type(exc).__name__}); requeued", requeue=True) from exc


def run_worker(argv: Sequence[str]) -> None:
    """Run a Celery worker of the fleet's app, with ``rollout.run`` registered (above)."""
    app.worker_main(list(argv))
