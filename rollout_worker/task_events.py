"""Celery's task events (what Flower shows), sent in batches.

Celery buffers a worker's task events (received, started, succeeded) and, on its consumer's
event loop, publishes the buffer as one ``task-multi`` message — but it schedules that
publish as soon as any event is buffered, so under load nearly every event still costs a
Redis ``PUBLISH`` of its own: three per rollout, each built and sent through kombu on the
consumer's thread (≈ 2 ms of worker CPU per rollout, docs/PERFORMANCE.md). This consumer
step leaves the events as they are and only changes when they go: every
:data:`FLUSH_SECONDS` on the consumer's timer, all buffered events in one message. Flower
(and any ``celery events`` receiver) splits a ``task-multi`` message back into its events,
so its view is unchanged, at most :data:`FLUSH_SECONDS` later.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, bootsteps
from celery.worker.consumer.events import Events

FLUSH_SECONDS = 0.25
# A burst between two flushes is sent early, from the thread that filled the buffer (the
# dispatcher's mutex serialises it with the timer's flush).
BUFFER_LIMIT = 2000


class BatchedTaskEvents(bootsteps.StartStopStep):
    """Flush the consumer's buffered task events on a timer instead of after each event."""

    requires = (Events,)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._timer: Any = None

    def start(self, parent: Any) -> None:
        dispatcher = parent.event_dispatcher
        if dispatcher is None or parent.hub is None:
            return  # no buffering without the consumer's event loop: Celery's default
        dispatcher.on_send_buffered = None
        dispatcher.buffer_limit = BUFFER_LIMIT
        if self._timer is None:  # the consumer restarts this step after a reconnection
            self._timer = parent.timer.call_repeatedly(FLUSH_SECONDS, parent._flush_events)

    def shutdown(self, parent: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if parent.event_dispatcher is not None:
            parent._flush_events()  # what the last period buffered


def install(app: Celery) -> None:
    app.steps["consumer"].add(BatchedTaskEvents)


__all__ = ["FLUSH_SECONDS", "BatchedTaskEvents", "install"]
