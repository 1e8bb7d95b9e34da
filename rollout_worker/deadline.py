"""A stopping worker exits by a deadline, whatever still blocks it.

Celery's own shutdown talks to the broker with blocking calls on its main thread, where
nothing of ours can cut them short: on a Redis that does not answer, its worker-offline event
alone waits 30 s per try (the broker's socket timeout), and is retried. A worker told to stop
must exit in bounded time all the same (else its supervisor kills it, much later), so once
it is stopping, an :class:`ExitDeadline` ends the process when it comes. Nothing is lost: a
rollout still held then is one whose hand-back could not reach Redis; its lease lapses and
another worker's sweeper requeues it, as after a crash.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

EXIT_STOPPED = 0  # what Celery's warm shutdown exits with: the stop asked for happened


class ExitDeadline:
    """Arm it (from any thread) and the process exits when the earliest armed deadline comes,
    unless it ended before; ``last_words`` runs first (it must not block)."""

    def __init__(self, last_words: Callable[[], None]) -> None:
        self._last_words = last_words
        self._once = threading.Lock()

    def arm(self, seconds: float) -> None:
        """Exit ``seconds`` from now at the latest (an earlier deadline still holds)."""
        timer = threading.Timer(seconds, self._expire, args=(seconds,))
        timer.daemon = True  # a process that ends by itself does not wait for it
        timer.name = "exit-deadline"
        timer.start()

    def _expire(self, seconds: float) -> None:
        if not self._once.acquire(blocking=False):
            return  # an earlier deadline is already ending the process
        logger.warning(
            "stopping: the shutdown outran its %gs deadline (is Redis unreachable?); exiting "
            "now: rollouts not handed back return to the queue when their leases lapse",
            seconds,
        )
        try:
            self._last_words()
        except Exception:
            logger.exception("stopping: last words failed")
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_STOPPED)


__all__ = ["EXIT_STOPPED", "ExitDeadline"]
