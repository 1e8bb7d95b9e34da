"""The worker's intake: it takes rollout messages off the queue itself, on its event loop.

Celery's worker still runs in the process — its remote control (Flower's Revoke), its
heartbeats and the task events Flower shows go through it — but it consumes no queue
(``rollout-fleet worker`` excludes the rollout queue). Its consumer thread, thread pool and
the hop from a pool thread to the loop for every task cost as much CPU as the rest of a
no-op rollout (CHANGELOG.md, 0.1.0); here a message costs one ``BRPOP`` and a task.

A message is taken only while one of the worker's slots is free (``rollout_worker/slots.py``),
so a worker never holds more messages than it runs, and what it took starts at once: the claim
follows in the same turn of the loop. A worker that dies in between loses the message; the
lost-message check resends its rollout (``rollout_worker/sweeper.py``), as it did when Celery
held taken messages in memory. A message whose task id was revoked (Flower's Revoke of a queued
rollout) is not run: its rollout is cancelled, and a v1 trainer is told. A message whose
record key is outside this fleet's prefix (another fleet shares the queue name, which
start-up refuses once it knows: ``rollout_core/durability.py``) is put back untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Container

from rollout_core import logs
from rollout_core.queue.envelope import NotARollout, QueuedMessage, read_taken
from rollout_core.store import RecordKey, RecordStore, StoreError
from rollout_worker.execution import Executor
from rollout_worker.slots import Slots
from rollout_worker.task_events import TaskEventOutbox

logger = logging.getLogger(__name__)

# How long one take waits for a message: a stopping worker stops taking within it, and an
# idle worker costs Redis one command per this period.
TAKE_WAIT_SECONDS = 1.0
RETRY_SECONDS = 1.0  # after a take failed (Redis away)
# A take that has not come back for this long means the intake is stuck (liveness).
SILENCE_SECONDS = 10.0
# After putting back another fleet's message, the intake waits this long before taking more.
FOREIGN_PAUSE_SECONDS = 1.0


class Intake:
    def __init__(
        self,
        store: RecordStore,
        executor: Executor,
        slots: Slots,
        events: TaskEventOutbox,
        revoked: Container[str],
        cancel_unstarted: Callable[[RecordKey], Awaitable[None]],
        requeue_message: Callable[[RecordKey], str],
    ) -> None:
        self._store = store
        self._executor = executor
        self._slots = slots
        self._events = events
        self._revoked = revoked  # Celery's revoked task ids (its control thread adds to it)
        self._cancel_unstarted = cancel_unstarted
        self._requeue_message = requeue_message
        self._stopping = False
        self._turned = time.monotonic()  # when a take last came back
        self._redis_away = False
        self._taking = False  # a take is in progress (it may bring a message)
        self._runner: asyncio.Task[None] | None = None
        self._runs: dict[asyncio.Task[None], RecordKey] = {}

    @property
    def taken(self) -> set[RecordKey]:
        """The rollouts whose message this worker took and has not finished with."""
        return set(list(self._runs.values()))

    def alive(self) -> bool:
        """Taking messages, or busy with all its slots."""
        return self._slots.locked() or time.monotonic() - self._turned < SILENCE_SECONDS

    async def start(self) -> None:
        """Take and start messages, in a task of the loop, until :meth:`stop_taking`."""
        self._runner = asyncio.create_task(self._take_and_start())

    async def _take_and_start(self) -> None:
        while True:
            await self._slots.take()
            if self._stopping:  # stopped while it waited for a slot
                self._slots.free()
                return
            self._taking = True  # until a message taken is started or put back
            try:
                raw = await self._take()
                message = None if raw is None else self._read(raw)
                if message is not None and not self._store.keys.owns(message.record):
                    await self._put_back_foreign(message, raw or "")
                    message = None
            except BaseException:
                self._slots.free()
                raise
            finally:
                self._taking = False
            if message is None:
                self._slots.free()
            else:
                self._start(message)

    async def stop_taking(self) -> None:
        """Take no more messages; returns once no take is in progress (the message one
        brings still starts: a stopping executor hands it straight back)."""
        self._stopping = True
        if self._runner is None:
            return
        if not self._taking:  # waiting for a slot, which may never free: stop waiting
            self._runner.cancel()
        await asyncio.wait([self._runner])

    async def drained(self) -> None:
        """Wait for every rollout taken to end."""
        if self._runs:
            await asyncio.wait(list(self._runs))

    async def _take(self) -> str | None:
        try:
            raw = await self._store.take(TAKE_WAIT_SECONDS)
        except Exception as exc:  # StoreError, or anything else: never the end of taking
            if not self._redis_away:
                logger.warning("cannot take messages (%s); retrying", type(exc).__name__)
            self._redis_away = True
            await asyncio.sleep(RETRY_SECONDS)
            return None
        if self._redis_away:
            logger.info("taking messages again")
            self._redis_away = False
        self._turned = time.monotonic()
        return raw

    @staticmethod
    def _read(raw: str) -> QueuedMessage | None:
        try:
            return read_taken(raw)
        except NotARollout as exc:
            logger.error("dropped a queued message that is not a rollout's: %s", exc)  # noqa: TRY400
            return None

    async def _put_back_foreign(self, message: QueuedMessage, raw: str) -> None:
        """A message of another fleet (a record key outside this fleet's prefix: two fleets
        share the queue name) goes back to the queue, untouched, for that fleet's workers;
        this intake pauses, so that they, not it, take it next."""
        try:
            await self._store.put_back(raw)
        except StoreError as exc:
            logger.error(  # noqa: TRY400 - one line: the record key says whose it is
                "took another fleet's rollout %s (its key is outside prefix %r) and could not "
                "put it back (%s); that fleet's lost-message check resends it",
                message.record,
                self._store.keys.prefix,
                type(exc).__name__,
            )
        else:
            logger.error(
                "put back another fleet's rollout %s: its key is outside this fleet's prefix "
                "%r, so two fleets share the queue %r (give each its own ROLLOUT_FLEET_QUEUE)",
                message.record,
                self._store.keys.prefix,
                self._store.queue,
            )
        await asyncio.sleep(FOREIGN_PAUSE_SECONDS)

    def _start(self, message: QueuedMessage) -> None:
        key = RecordKey(message.record)
        run = self._revoked_run if message.task_id in self._revoked else self._run
        task = asyncio.create_task(run(key, message))
        self._runs[task] = key
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        del self._runs[task]
        self._slots.free()

    async def _run(self, key: RecordKey, message: QueuedMessage) -> None:
        """One message run: its task events around the executor's run (this task is the
        execution's: a cancel, a revoke or a lost lease cancels it)."""
        events, task_id = self._events, message.task_id
        events.received(message)
        events.started(task_id)
        started = time.monotonic()
        logs.begin(self._store.keys.record_id(key))  # this task's lines name the rollout
        try:
            outcome = await self._executor.execute(key, task_id)
        except asyncio.CancelledError:
            outcome = "cancelled"
        except StoreError as exc:
            # Redis failed before the claim got through: the message goes back to the queue
            # (a duplicate is harmless: the claim sorts it out).
            events.failed(task_id, exc)
            await self._hand_back(key, exc)
            return
        except Exception as exc:
            logger.exception("%s: the execution failed", key)
            events.failed(task_id, exc)
            return
        runtime = time.monotonic() - started
        logger.info("finished (%s) in %.3fs", outcome, runtime)
        events.succeeded(task_id, outcome, runtime)

    async def _revoked_run(self, key: RecordKey, message: QueuedMessage) -> None:
        self._events.received(message)
        self._events.revoked(message.task_id)
        logger.warning("%s: revoked before it started; cancelling it", key)
        try:
            await self._cancel_unstarted(key)
        except StoreError as exc:
            await self._hand_back(key, exc)

    async def _hand_back(self, key: RecordKey, error: StoreError) -> None:
        """Redis failed under a rollout taken here: put its message back if it still waits
        (one that started holds a lease, which the sweeper takes back if it lapses)."""
        try:
            handed_back = await self._store.hand_back(key, "", self._requeue_message(key))
        except StoreError:
            logger.warning(
                "%s: taken while Redis failed (%s) and not handed back; the lost-message "
                "check resends it",
                key,
                type(error).__name__,
            )
            return
        if handed_back:
            logger.warning("%s: Redis failed (%s); message put back", key, type(error).__name__)


__all__ = ["RETRY_SECONDS", "SILENCE_SECONDS", "TAKE_WAIT_SECONDS", "Intake"]
