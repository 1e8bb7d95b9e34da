"""Executing rollouts in a worker process: claim → carry (protocol-specific) → finish.

The executor owns what every protocol shares: the claim that makes duplicate messages
harmless, the per-process slot limit, the lease heartbeat, cancelling a rollout's task when
its lease is lost, handing rollouts back when the worker stops, and the rollouts a claim says
must not run (:class:`Refusal`). What "running a rollout" means (v1: run the agent loop, post
the completion callback) is a :class:`Carrier`, looked up by the record's protocol. A worker
has a carrier for both generations: the one its agent speaks runs rollouts, the other only
refuses them (a record of the other generation: the agent changed while rollouts waited, or
another fleet shares the Redis database), so every claimed rollout ends.

Words: a *worker* is one worker process (its name is unique in the fleet); an *execution* is
one run of one rollout on it, and holds that rollout's lease.

Crashes are attributed by running alone. A worker that dies takes every rollout it runs down
with it, and only one of them may have caused it (an agent that calls ``os._exit`` or
segfaults): so a crash counts against a rollout's ``ROLLOUT_FLEET_MAX_ATTEMPTS`` only if it ran
alone on its worker (``_prelude.lua``, forgive_shared_crash). A rollout whose worker crashed
twice while it ran beside others runs alone from then on: its worker lets the others end and
takes no more until it is done (``rollout_worker/slots.py``). A worker with one slot runs
everything alone. One crash of a busy worker (killed, out of memory, its machine lost) costs
nobody an attempt and slows nobody down; an agent that kills every worker it runs on takes its
neighbours down twice at most, then crashes alone until its attempts run out.

A write Redis refuses is no crash. Redis that still answers may refuse one write of a
rollout: it is full (``maxmemory``), the value is larger than it takes, or it cuts the
connection the write went on. The execution keeps its lease (the heartbeat still renews it:
renewals run at ``maxmemory``), tries the write again a few times with a pause between
(:data:`REFUSED_WRITE_TRIES`), and if Redis keeps refusing it, ends the rollout once with the
real reason (:class:`~rollout_core.store.WriteRefused`). Left to its lease, it would be run
again by another worker, counted as its worker's crash, and after enough of those end as
"the worker running it stopped (crashed or was killed) each time".
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Container, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol as Interface

from rollout_core import logs, tracing
from rollout_core.protocols.sealed import UnreadableRecord
from rollout_core.secrets import hiding
from rollout_core.settings import FleetSettings
from rollout_core.store import (
    ALONE_AFTER_FORGIVEN,
    Advance,
    Claim,
    Protocol,
    RecordField,
    RecordKey,
    RecordStore,
    Status,
    StoreError,
    StoreFull,
    StoreReplyError,
    StoreUnavailable,
    Verdict,
    WriteRefused,
)
from rollout_worker import metrics
from rollout_worker.slots import Slots
from rollout_worker.trajectories import TrajectorySink

logger = logging.getLogger(__name__)

LEASE_LOST = "lease lost"
HANDED_BACK = "handed back"
CANCELLED = "cancelled"  # the message of a cancelled rollout, in both generations
STOPPED_UNANSWERED = "the worker stopped before the trainer answered"
RECYCLED_UNREAD = (
    "the worker was restarted (an agent blocked its event loop) before it read the trainer's answer"
)


# A write of a rollout Redis refuses while it answers is tried this many times in all, the
# pause between tries doubling from REFUSED_WRITE_PAUSE_SECONDS up to REFUSED_WRITE_MAX_PAUSE.
REFUSED_WRITE_TRIES = 5
REFUSED_WRITE_PAUSE_SECONDS = 0.5
REFUSED_WRITE_MAX_PAUSE = 4.0
# Redis's words for a write too large for it (proto-max-bulk-len, client-query-buffer-limit).
_TOO_LARGE = ("too large", "invalid bulk length", "protocol error", "query buffer")


def refused_message(reason: str) -> str:
    """What a rollout whose write Redis refused ends with."""
    return f"Redis refused to store this rollout's outcome ({reason}); the worker was not at fault"


def time_limit_message(seconds: float) -> str:
    return (
        f"rollout ran longer than the fleet's limit of {seconds:g}s "
        "(ROLLOUT_FLEET_MAX_ROLLOUT_SECONDS)"
    )


@dataclass(frozen=True)
class Refusal:
    """A claimed rollout that must not run: why (the claim's verdict) and what to tell."""

    verdict: Verdict  # CANCELLED, EXHAUSTED or ABANDONED
    message: str

    @classmethod
    def of(cls, claim: Claim) -> Refusal | None:
        """The one place that words the refusals, for both generations."""
        if claim.verdict is Verdict.CANCELLED:
            return cls(claim.verdict, CANCELLED)
        if claim.verdict is Verdict.EXHAUSTED:
            runs, forgiven = claim.attempt - 1, claim.record.forgiven
            message = (
                f"rollout failed after {runs} attempts: the worker running it stopped (crashed "
                "or was killed) each time"
            )
            if forgiven:
                message += (
                    f", {runs - forgiven} of them while it ran alone there ({forgiven} beside "
                    "other rollouts were not counted)"
                )
            return cls(claim.verdict, message)
        if claim.verdict is Verdict.ABANDONED:
            reason = claim.record.abandon_reason or "a worker gave the rollout up"
            return cls(claim.verdict, reason)
        return None

    @classmethod
    def foreign(cls, protocol: Protocol, speaks: Protocol) -> Refusal | None:
        """A rollout of a generation this worker's agent does not speak."""
        if protocol == speaks:
            return None
        message = (
            f"this fleet's agent speaks {speaks}; a {protocol} rollout cannot run on it (admitted "
            "before the agent changed, or by another fleet sharing this Redis database)"
        )
        return cls(Verdict.ABANDONED, message)


class Lease:
    """One execution's hold on one rollout; every state change through it checks the hold.

    The lease belongs to the execution, not the worker process: when a lease lapses while its
    execution still runs and the same process claims the rollout again, the stale execution
    must not be able to renew, finish or hand back the new one.

    It also knows, on the monotonic clock, until when the hold was last confirmed (the claim,
    then each heartbeat renewal), so a step that must not happen without it (a v1 callback
    POST) can check it for free while the heartbeat keeps up, and asks Redis only once that
    time is near: after the process was frozen or its loop stalled past a renewal.
    """

    def __init__(
        self,
        store: RecordStore,
        key: RecordKey,
        execution: str,
        retention_seconds: float,
        settings: FleetSettings,
        confirmed_until: float,
    ) -> None:
        self.store = store
        self.key = key
        self.execution = execution
        self.retention_seconds = retention_seconds
        self._settings = settings
        self.confirmed_until = confirmed_until  # monotonic seconds
        self.lost = False  # set once any renewal found it leased to another execution
        self.posted = False  # a v1 callback attempt of this execution went out (its body)
        self.attempts_out = 0  # how many of its attempts did
        # Between "may this attempt go out?" and "it went out": the watchdog's thread bars
        # posting while the loop may be running (:meth:`bar`).
        self._gate = threading.Lock()

    @property
    def seconds(self) -> float:
        """The lease's length (``ROLLOUT_FLEET_LEASE_SECONDS``)."""
        return self._settings.lease_seconds

    def renewed(self, asked_at: float) -> None:
        """A renewal sent at ``asked_at`` (monotonic) found the lease still held."""
        self.confirmed_until = max(self.confirmed_until, asked_at + self._settings.lease_seconds)

    async def confirm(self) -> bool:
        """Whether this execution still holds the rollout. Free while at least half a lease is
        left since the last confirmation; otherwise one renewal in Redis (which also extends
        it). False once the lease is known lost."""
        if self.lost:
            return False
        now = time.monotonic()
        if now < self.confirmed_until - self._settings.lease_seconds / 2:
            return True
        lost, _ = await self.store.renew(
            {self.execution: self.key},
            self._settings.lease_seconds,
            self._settings.inflight_ttl_seconds,
        )
        if lost:
            self.lost = True
            return False
        self.renewed(now)
        return True

    def mark_posted(self) -> bool:
        """A callback attempt is about to go on the wire: record it, unless posting was barred
        (then False, and it must not go)."""
        with self._gate:
            if self.lost:
                return False
            self.posted = True
            return True

    def bar(self) -> bool:
        """From any thread: no callback attempt of this execution goes out from now on (the
        worker is going away); whether one already went out."""
        with self._gate:
            self.lost = True
            return self.posted

    async def advance(
        self,
        status: Status,
        *,
        result: str = "",
        cancelled_result: str = "",
        fields: Mapping[RecordField, str] | None = None,
    ) -> Advance:
        """Move the rollout to ``status`` (``cancelled_result`` instead of a success if its
        cancellation was requested); ``Advance.LOST`` if the lease was lost. A write Redis
        refuses while it answers is tried again, the lease kept, up to
        :data:`REFUSED_WRITE_TRIES` times (a value too large for it: once); then
        :class:`WriteRefused`. Redis not answering raises as it is (the lease decides)."""
        pause = REFUSED_WRITE_PAUSE_SECONDS
        for attempt in range(1, REFUSED_WRITE_TRIES + 1):
            try:
                advanced = await self.store.advance(
                    self.key,
                    self.execution,
                    status,
                    result=result,
                    retention_seconds=self.retention_seconds,
                    cancelled_result=cancelled_result,
                    fields=fields,
                )
                break
            except StoreError as exc:
                reason = await self._refusal(exc)
                if reason is None:
                    raise
                # A value too large for Redis stays so; a full Redis or a cut may pass.
                too_large = isinstance(exc, StoreReplyError) and not isinstance(exc, StoreFull)
                if too_large or attempt == REFUSED_WRITE_TRIES:
                    raise WriteRefused(reason) from exc
                logger.warning(
                    "%s: Redis refused a write of this rollout (%s); its lease is kept and the "
                    "write tried again in %gs (try %d of %d)",
                    self.key,
                    reason,
                    pause,
                    attempt + 1,
                    REFUSED_WRITE_TRIES,
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, REFUSED_WRITE_MAX_PAUSE)
        if advanced is Advance.LOST:
            self.lost = True
        return advanced

    async def _refusal(self, error: StoreError) -> str | None:
        """Why Redis refused a write it failed with ``error``, if it refused it (it is full,
        the value is too large for it, or the connection the write went on was cut while
        Redis answers others); None when Redis itself is away."""
        if isinstance(error, StoreFull):
            return "Redis is full (maxmemory)"
        if isinstance(error, StoreReplyError):
            text = str(error)
            if any(words in text.lower() for words in _TOO_LARGE):
                return f"the value is larger than Redis takes: {text}"
            return None
        if isinstance(error, StoreUnavailable):
            try:
                await self.store.ping()
            except StoreError:
                return None  # Redis is away: not this write's doing
            return f"Redis cut the connection this write went on ({error}), answering others"
        return None


class Carrier(Interface):
    """Takes one claimed rollout of a protocol to a terminal status.

    Both methods return that status, or ``None`` when the lease was lost on the way (the
    rollout now belongs to another execution, or was finished for it, and this one's result
    was discarded).
    """

    protocol: Protocol  # the generation it carries
    retention_seconds: float  # how long a finished record of this protocol is kept

    def secret(self, claim: Claim) -> str | None:
        """The API key the rollout's record carries (hidden from every log line while this
        worker holds it), or ``None``: none, or one that does not open."""
        ...

    async def carry(self, claim: Claim, lease: Lease) -> Status | None:
        """Run the rollout (or deliver its stored result)."""
        ...

    async def refuse(self, claim: Claim, refusal: Refusal, lease: Lease) -> Status | None:
        """Finish the rollout without running it, telling its trainer why."""
        ...

    async def fail(self, claim: Claim, message: str, lease: Lease) -> Status | None:
        """End a rollout this worker cannot carry (its record cannot be read:
        :class:`UnreadableRecord`; or the worker faulted on it) once, saying why: the record
        says it, and a v1 trainer hears it in an ERROR callback sent without a key."""
        ...


class Executor:
    def __init__(
        self,
        store: RecordStore,
        worker: str,
        settings: FleetSettings,
        carriers: Iterable[Carrier],
        speaks: Protocol,
        requeue_message: Callable[[RecordKey], str],
        slots: Slots,
        sink: TrajectorySink | None = None,
    ) -> None:
        self.store = store
        self._slots = slots
        self.worker = worker
        self._sink = sink
        self._settings = settings
        self._carriers = {carrier.protocol: carrier for carrier in carriers}
        self._speaks = speaks  # the generation the agent speaks; the other is refused
        self._requeue_message = requeue_message
        self._executions: dict[str, _Execution] = {}  # by execution id
        self._stopping = False

    @property
    def leases(self) -> dict[RecordKey, str]:
        """record → execution of every rollout running here (the newest execution's)."""
        return {e.key: execution for execution, e in list(self._executions.items())}

    @property
    def running(self) -> dict[RecordKey, asyncio.Task[object]]:
        """Each running rollout's task (a copy: the loop-watchdog thread reads it too)."""
        return {e.key: e.task for e in list(self._executions.values())}

    async def execute(self, key: RecordKey, task_id: str = "") -> str:
        """Run one message of ``rollout.run`` (Celery task ``task_id``) in the calling task,
        which becomes the execution's (cancelling it stops the rollout); returns a short
        outcome for Flower."""
        with logs.about(self.store.keys.record_id(key)):
            return await self._execute(key, task_id)

    async def _execute(self, key: RecordKey, task_id: str) -> str:
        execution = f"{self.worker}:{uuid.uuid4().hex[:8]}"
        asked_at = time.monotonic()
        claim = await self.store.claim(
            key,
            execution,
            self.worker,
            self._settings.lease_seconds,
            self._settings.max_attempts,
            task_id,
            alone=self._slots.count == 1,
        )
        if not claim.acquired:
            logger.info("%s: not run (%s)", key, claim.verdict)
            return claim.verdict.value
        if self._stopping and await self._hand_back_one(key, execution):
            return HANDED_BACK
        task = asyncio.current_task()
        assert task is not None
        protocol = claim.record.protocol
        if claim.attempt == 1 and claim.verdict is Verdict.RUNNING:
            metrics.QUEUE_WAIT.labels(protocol).observe(claim.since_accepted)
        started = time.monotonic()
        metrics.INFLIGHT.inc()
        carrier = self._carriers[protocol]
        lease = Lease(
            self.store,
            key,
            execution,
            carrier.retention_seconds,
            self._settings,
            asked_at + self._settings.lease_seconds,
        )
        # Registered only inside the try: whatever fails, the heartbeat stops renewing it.
        self._executions[execution] = _Execution(key, task, task_id, lease, carrier, claim)
        try:
            refusal = Refusal.of(claim) or Refusal.foreign(protocol, self._speaks)
            with (
                tracing.execution(claim.record, self.store.keys.record_id(key)),
                hiding(carrier.secret(claim)),
            ):
                async with self._alone_if_suspect(claim, refusal, lease):
                    status = await self._carry(carrier, claim, refusal, lease)
        finally:
            metrics.INFLIGHT.dec()
            del self._executions[execution]
        if status is None:
            return LEASE_LOST
        metrics.DURATION.labels(protocol, status.value).observe(time.monotonic() - started)
        if self._sink is not None:
            await self._keep_trajectory(self._sink, key)
        return status.value

    @asynccontextmanager
    async def _alone_if_suspect(
        self, claim: Claim, refusal: Refusal | None, lease: Lease
    ) -> AsyncIterator[None]:
        """Run a rollout forgiven :data:`ALONE_AFTER_FORGIVEN` crashes alone (see module)."""
        if (
            refusal is not None
            or claim.verdict is not Verdict.RUNNING
            or claim.record.forgiven < ALONE_AFTER_FORGIVEN
            or claim.record.alone == lease.execution  # marked at the claim already
        ):
            yield
            return
        logger.warning(
            "%s: its worker crashed %d times while it ran beside other rollouts; it runs alone "
            "here, after the %d others end",
            lease.key,
            claim.record.forgiven,
            len(self._executions) - 1,
        )
        async with self._slots.alone():
            metrics.RUNS_ALONE.inc()
            await self.store.mark_alone(lease.key, lease.execution)  # lost: the heartbeat says
            yield

    async def _carry(
        self, carrier: Carrier, claim: Claim, refusal: Refusal | None, lease: Lease
    ) -> Status | None:
        try:
            if refusal is not None:
                return await carrier.refuse(claim, refusal, lease)
            return await carrier.carry(claim, lease)
        except UnreadableRecord as exc:  # running it again cannot help: it fails, once
            logger.error("%s: the record cannot be read: %s", lease.key, exc)  # noqa: TRY400
            return await carrier.fail(claim, f"the rollout's record cannot be read: {exc}", lease)
        except WriteRefused as exc:
            # Redis answers but refused this rollout's write: no crash; it ends here, once.
            logger.error("%s: %s; it ends here", lease.key, refused_message(str(exc)))  # noqa: TRY400
            return await self._end_refused(carrier, claim, lease, str(exc))
        except StoreError as exc:
            # Redis trouble passes; the rollout is taken over once its lease lapses, and run
            # again from its start: say so, the trainer sees its calls again.
            logger.warning(
                "%s: Redis did not take a write of this rollout (%r): it is left to its lease "
                "and runs again once the lease lapses",
                lease.key,
                exc,
            )
            raise
        except Exception as exc:
            # A fault of the fleet's own on this rollout (the agent's errors are results
            # already): another attempt would most likely fail the same way, so it ends now,
            # once, saying why, instead of being retried until its attempts run out.
            logger.exception("%s: the worker failed carrying it", lease.key)
            message = f"the worker failed carrying this rollout: {type(exc).__name__}"
            return await carrier.fail(claim, message, lease)

    async def _end_refused(
        self, carrier: Carrier, claim: Claim, lease: Lease, reason: str
    ) -> Status | None:
        """End a rollout whose write Redis refused, saying so; if Redis refuses that ending
        too, abandon it with the reason, so that its next claim ends it, and never as a
        crash of this worker (its lease would lapse, another worker would run it again)."""
        message = refused_message(reason)
        try:
            return await carrier.fail(claim, message, lease)
        except StoreError as exc:
            logger.error("%s: its ending was refused too (%r); abandoned", lease.key, exc)  # noqa: TRY400
            requeue = self._requeue_message(lease.key)
            handed = await lease.store.hand_back(lease.key, lease.execution, requeue, message)
            if not handed:
                raise
            lease.lost = True
            return None

    @staticmethod
    async def _keep_trajectory(sink: TrajectorySink, key: RecordKey) -> None:
        try:
            await sink.write(key)
        except (OSError, StoreError) as exc:  # the rollout is done either way
            logger.warning("%s: trajectory not written to the sink: %r", key, exc)

    async def hand_back(self, grace_seconds: float, hand_back_seconds: float) -> int:
        """The worker is stopping: let running rollouts finish for ``grace_seconds``, then
        hand the rest back to the queue, where another worker takes them at once, within
        ``hand_back_seconds`` (each hand-back may retry for its whole budget on a Redis that
        does not answer). Rollouts claimed from now on are handed back straight away. Returns how
        many went back."""
        self._stopping = True
        if self._executions:
            tasks = [e.task for e in self._executions.values()]
            await asyncio.wait(tasks, timeout=grace_seconds)
        held, handed = list(self._executions.items()), 0
        try:
            async with asyncio.timeout(hand_back_seconds):
                kept = []
                for execution, running in held:
                    # Handed back first: whatever the cancelled task writes afterwards is refused.
                    if await self._hand_back_one(running.key, execution):
                        running.task.cancel()
                        handed += 1
                    else:
                        kept.append((execution, running))
                for execution, running in kept:  # delivering, or finished meanwhile
                    if running.task.done():
                        continue
                    if running.lease.bar():
                        await self._end_on_the_wire(running)
                    elif await self._hand_back_one(running.key, execution, unposted=True):
                        running.task.cancel()  # barred: it can no longer post
                        handed += 1
        except (TimeoutError, StoreError) as exc:
            # Not handed back, so left running: cancelled, one could still write its outcome.
            # Their leases lapse once the worker exits and other workers' sweepers requeue
            # them, as after a crash.
            logger.warning(
                "stopping: could not hand back %d rollouts (%s); their leases will lapse",
                len(held) - handed,
                type(exc).__name__,
            )
        metrics.REQUEUES.labels("handed_back").inc(handed)
        return handed

    @staticmethod
    async def _end_on_the_wire(running: _Execution) -> None:
        """A v1 callback still on the wire as the worker stops: it ends here, saying the
        trainer may have it, as a POST that outlived the client timeout does. Left to lapse,
        its lease would hand the stored result to another worker to post again."""
        logger.warning("%s: stopping with its callback unanswered; it ends here", running.key)
        await running.carrier.fail(running.claim, STOPPED_UNANSWERED, running.lease)
        running.task.cancel()

    async def _hand_back_one(
        self, key: RecordKey, execution: str, *, unposted: bool = False
    ) -> bool:
        message = self._requeue_message(key)
        return await self.store.hand_back(key, execution, message, unposted=unposted)

    def bar_posting(self) -> list[Departing]:
        """From any thread, as the worker goes away with its loop stuck: no execution here
        posts a callback from now on. Each, with whether its callback already went out."""
        return [
            Departing(
                execution,
                running.key,
                running.lease.bar(),
                running.lease.attempts_out,
                running.carrier,
                running.claim,
            )
            for execution, running in list(self._executions.items())
        ]

    def cancel(self, key: RecordKey) -> bool:
        """Stop every execution of ``key`` here; False if none runs."""
        tasks = [e.task for e in self._executions.values() if e.key == key]
        for task in tasks:
            task.cancel()
        return bool(tasks)

    def cancel_revoked(self, revoked: Container[str]) -> list[RecordKey]:
        """Stop the executions running under a revoked Celery task id; their rollouts."""
        hit = [e for e in list(self._executions.values()) if e.task_id and e.task_id in revoked]
        for running in hit:
            if not running.task.cancelling():
                running.task.cancel()
        return [running.key for running in hit]

    async def renew_leases(self) -> None:
        """Extend the lease of every execution running here; cancel the ones that lost it and
        the ones whose cancellation was requested (in case its stop message was missed)."""
        asked = dict(self._executions)
        asked_at = time.monotonic()
        lost, stop = await self.store.renew(
            {execution: e.key for execution, e in asked.items()},
            self._settings.lease_seconds,
            self._settings.inflight_ttl_seconds,
        )
        for execution, held in asked.items():
            if execution not in lost:
                held.lease.renewed(asked_at)
        for execution in lost:
            running = self._executions.get(execution)
            if running is not None:
                running.lease.lost = True  # first: the cancel reads it
                running.task.cancel()
                metrics.WORKER_LEASES_LOST.inc()
                logger.warning("%s: lease lost; its execution here stopped", running.key)
        for execution in stop:
            running = self._executions.get(execution)
            if running is not None and not running.task.cancelling():
                running.task.cancel()
                logger.info("%s: cancellation requested; its execution here stopped", running.key)


@dataclass(frozen=True)
class Departing:
    """An execution of a worker going away (:meth:`Executor.bar_posting`)."""

    execution: str
    key: RecordKey
    posted: bool  # its v1 callback went out: it must end, not be handed back
    attempts_out: int  # how many times
    carrier: Carrier
    claim: Claim

    async def end_on_the_wire(self, store: RecordStore, settings: FleetSettings) -> None:
        """End it, its callback's answer never read (:data:`RECYCLED_UNREAD`), through
        ``store`` (the worker's own client may be stuck with its loop)."""
        lease = Lease(store, self.key, self.execution, self.carrier.retention_seconds, settings, 0)
        lease.posted, lease.attempts_out = True, self.attempts_out
        await self.carrier.fail(self.claim, RECYCLED_UNREAD, lease)


@dataclass(frozen=True)
class _Execution:
    key: RecordKey
    task: asyncio.Task[object]
    task_id: str  # the Celery task id it runs under ("" when none)
    lease: Lease
    carrier: Carrier
    claim: Claim


__all__ = [
    "CANCELLED",
    "HANDED_BACK",
    "LEASE_LOST",
    "RECYCLED_UNREAD",
    "REFUSED_WRITE_TRIES",
    "STOPPED_UNANSWERED",
    "Carrier",
    "Departing",
    "Executor",
    "Lease",
    "Refusal",
    "refused_message",
    "time_limit_message",
]
