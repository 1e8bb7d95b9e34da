"""Celery's task events (what Flower shows) for the rollouts a worker runs, sent in batches.

The worker takes its messages itself (``rollout_worker/intake.py``), so Celery never sees the
tasks it runs and would send no task event. The intake posts each event (received, started,
succeeded, failed, revoked) to :data:`OUTBOX` from the event loop, which costs an append;
a step of Celery's consumer hands them to Celery's own event dispatcher on the consumer's
thread and publishes all of them as one ``task-multi`` message every :data:`FLUSH_SECONDS`.
Flower (and any ``celery events`` receiver) splits that message back into its events, so it
shows every rollout's task as before, at most :data:`FLUSH_SECONDS` later. Each event keeps
the time it happened, not the time it was sent.

Whether events are sent follows Celery's switch (``ROLLOUT_FLEET_TASK_EVENTS``, and Flower's
or ``celery control enable_events``): while it is off, the outbox drops what it is given.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, bootsteps
from celery.worker.consumer.events import Events

from rollout_core.queue.envelope import TASK_NAME, QueuedMessage
from rollout_sdk.core.foreign import describe

FLUSH_SECONDS = 0.25
# A burst between two flushes is sent early (by the consumer's thread, as it hands events on).
BUFFER_LIMIT = 2000


class TaskEventOutbox:
    """Task events waiting for Celery's consumer thread; safe to fill from any thread."""

    def __init__(self) -> None:
        self.enabled = False  # set by the consumer step, from Celery's dispatcher
        self._events: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()

    def received(self, message: QueuedMessage) -> None:
        self._put(
            "task-received",
            message.task_id,
            name=TASK_NAME,
            args=message.label,
            kwargs="{}",
            root_id=message.task_id,
            parent_id=None,
            retries=0,
            eta=None,
            expires=None,
        )

    def started(self, task_id: str) -> None:
        self._put("task-started", task_id)

    def succeeded(self, task_id: str, outcome: str, runtime: float) -> None:
        self._put("task-succeeded", task_id, result=repr(outcome), runtime=runtime)

    def failed(self, task_id: str, error: BaseException) -> None:
        self._put(
            "task-failed",
            task_id,
            exception=f"{type(error).__name__}({describe(error)!r})",
            traceback="",
        )

    def revoked(self, task_id: str) -> None:
        self._put("task-revoked", task_id, terminated=False, signum=None, expired=False)

    def _put(self, kind: str, task_id: str, **fields: Any) -> None:
        if self.enabled:
            self._events.append((kind, {"uuid": task_id, "timestamp": time.time(), **fields}))

    def hand_over(self, send: Callable[..., object]) -> None:
        """Give every waiting event to ``send`` (Celery's ``EventDispatcher.send``)."""
        while self._events:
            kind, fields = self._events.popleft()
            send(kind, **fields)


OUTBOX = TaskEventOutbox()


class BatchedTaskEvents(bootsteps.StartStopStep):
    """Every :data:`FLUSH_SECONDS`, on the consumer's timer: the outbox's events into Celery's
    dispatcher, and its buffer out as one message."""

    requires = (Events,)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._timer: Any = None

    def start(self, parent: Any) -> None:
        dispatcher = parent.event_dispatcher
        if dispatcher is None or parent.hub is None:
            return  # no consumer event loop to flush from: no events (the outbox stays off)
        dispatcher.on_send_buffered = None  # Celery's default: one publish per event
        dispatcher.buffer_limit = BUFFER_LIMIT
        if self._timer is None:  # the consumer restarts this step after a reconnection
            self._timer = parent.timer.call_repeatedly(FLUSH_SECONDS, self._flush, (parent,))
        OUTBOX.enabled = _sends_task_events(dispatcher)

    @staticmethod
    def _flush(parent: Any) -> None:
        dispatcher = parent.event_dispatcher
        if dispatcher is None:
            return
        OUTBOX.enabled = _sends_task_events(dispatcher)
        OUTBOX.hand_over(dispatcher.send)
        parent._flush_events()

    def shutdown(self, parent: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if parent.event_dispatcher is not None:
            self._flush(parent)  # what the last period gathered


def _sends_task_events(dispatcher: Any) -> bool:
    """The dispatcher is on for worker heartbeats whatever the switch; task events are a
    group of their own (what ``enable_events`` adds)."""
    groups = dispatcher.groups
    return bool(dispatcher.enabled) and (not groups or "task" in groups)


def install(app: Celery) -> None:
    app.steps["consumer"].add(BatchedTaskEvents)


__all__ = [
    "BUFFER_LIMIT",
    "FLUSH_SECONDS",
    "OUTBOX",
    "BatchedTaskEvents",
    "TaskEventOutbox",
    "install",
]
