"""The record store: the only code in the fleet that issues Redis commands.

Gateways, workers and the CLI call its typed methods; each state change of a rollout is one
Lua script (``lua/``), so it is atomic and costs one round trip. The scripts share the names
of ``schema.py`` (put in front of each as Lua locals) and the helpers of ``lua/_prelude.lua``;
their replies are parsed here into the types of ``replies.py``. Durations are seconds in this
API and milliseconds in Redis; :func:`_ms` is the one place that converts.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, Self, cast
from urllib.parse import urlsplit

from redis import Redis as SyncRedis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline, PubSub
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AuthenticationError,
    InvalidResponse,
    NoScriptError,
    OutOfMemoryError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollout_core.queue.envelope import QueuedMessage, read_queued, record_of_delivery
from rollout_core.settings import REDIS_COMMAND_TIMEOUT_SECONDS, FleetSettings
from rollout_core.store.record import RolloutRecord
from rollout_core.store.replies import (
    Claim,
    FleetCounts,
    FleetFigures,
    FleetWorkers,
    PollReply,
    V1Admission,
    WorkerBeat,
)
from rollout_core.store.schema import (
    PROTOCOLS,
    UNACKED,
    UNACKED_INDEX,
    WAITING,
    AdmitOutcome,
    AdmitStart,
    Advance,
    CancelOutcome,
    Change,
    Keys,
    PollOutcome,
    Protocol,
    RecordField,
    RecordKey,
    Status,
    Verdict,
    lua_prelude,
)

# What callers catch: the store's failures are Redis's own exceptions.
StoreError = RedisError
StoreUnavailable = (RedisConnectionError, RedisTimeoutError)
StoreReplyError = ResponseError
# What a reader that reports failures tells apart (the CLI): a Redis that does not answer in
# time, one that refused the credentials, and a server that does not speak Redis at all.
StoreTimeout = RedisTimeoutError
StoreAuthError = AuthenticationError
StoreNotRedis = InvalidResponse
StoreFull = OutOfMemoryError

POOL_WAIT_SECONDS = 10.0
# One call against a Redis that does not answer gives up within RETRY_BUDGET_SECONDS: each try
# waits at most REDIS_COMMAND_TIMEOUT_SECONDS (a blackholed Redis: three tries), and a refused or
# cut connection is retried, 0.1 s doubling to 2 s, until the budget is spent (a restarting
# Redis costs a pause, not a failed rollout). Every script tolerates running twice when its
# first reply was lost (a repeat finds the change made and says so).
RETRY_BUDGET_SECONDS = 10.0


class BudgetedRetry(Retry):
    """redis-py's retry, bounded by time rather than by a count of tries."""

    # When this process last failed to reach Redis (monotonic). On the class: every
    # connection works on its own deep copy of the retry.
    last_failure = -float("inf")

    def __init__(self, budget_seconds: float, try_seconds: float) -> None:
        super().__init__(ExponentialBackoff(cap=2.0, base=0.1), retries=-1)
        self._budget = budget_seconds
        self._try = try_seconds

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + self._budget

        async def failed(error: Exception, *rest: Any) -> None:
            BudgetedRetry.last_failure = time.monotonic()
            await fail(error, *rest)
            # Give up unless one more try (and the pause before it) fits in the budget.
            pause = self._backoff.compute(rest[0] if rest else 1)
            if time.monotonic() + pause + min(self._try, 1.0) > deadline:
                raise error

        return await super().call_with_retry(do, failed, *args, **kwargs)


RECONNECT = BudgetedRetry(RETRY_BUDGET_SECONDS, REDIS_COMMAND_TIMEOUT_SECONDS)
# A caller that reports a failure instead of riding it out (the CLI) tries once, and gives a
# connection this long to open.
FAIL_FAST_CONNECT_SECONDS = 2.0
SCAN_LIMIT = 20_000  # a listing reads at most this many unfinished and finished records
# Fields a listing reads: everything but the request and the (possibly large) result.
SUMMARY_FIELDS = (
    RecordField.PROTOCOL,
    RecordField.ROLLOUT_ID,
    RecordField.STATUS,
    RecordField.ATTEMPT,
    RecordField.WORKER,
    RecordField.ACCEPTED_AT,
    RecordField.STARTED_AT,
    RecordField.CLAIMED_AT,
    RecordField.FINISHED_AT,
    RecordField.CANCEL_REQUESTED,
    RecordField.DELIVERY,
)
# What a trainer may be told of a record (``RecordStore.held``).
_HELD = (RecordField.STATUS, RecordField.RESPONSE, RecordField.RESULT, RecordField.LEASE_DIGEST)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _record(fields: Sequence[RecordField], values: Sequence[str | None]) -> RolloutRecord:
    """A record from an ``HMGET`` of ``fields`` (a field it lacks reads as None)."""
    return RolloutRecord.parse(
        {name: value for name, value in zip(fields, values, strict=True) if value is not None}
    )


def _flatten(fields: Mapping[RecordField, str]) -> list[str]:
    return [item for pair in fields.items() for item in pair]


def _load_scripts(redis: Redis, keys: Keys) -> dict[str, AsyncScript]:
    folder = resources.files(__package__) / "lua"
    prelude = lua_prelude(keys) + (folder / "_prelude.lua").read_text()
    return {
        path.name.removesuffix(".lua"): redis.register_script(prelude + path.read_text())
        for path in folder.iterdir()
        if path.name.endswith(".lua") and not path.name.startswith("_")
    }


class _SentinelConnection(SentinelManagedConnection):
    """A connection to the primary the sentinels name. After a failover, a script's write or
    a ``WAIT`` that reaches the demoted primary fails as a reply, not as a broken connection:
    here it is one, so the retry reconnects to the new primary. And every reconnect asks the
    sentinels where the primary is: redis-py's command path reconnects to the address the
    connection last had, so a call in flight across a failover kept knocking on the dead
    primary's port until its retry budget ran out."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if "READONLY" in str(exc) or "WAIT cannot be used with replica" in str(exc):
                await self.disconnect()
                raise RedisConnectionError(f"the primary moved: {exc}") from exc
            raise


def _client(
    url: str,
    max_connections: int,
    sentinel_master: str,
    *,
    listening: bool = False,
    fail_fast: bool = False,
) -> Redis:
    """A client that reconnects and retries through connection failures (unless it should
    ``fail_fast``: then one try, and a short connect timeout), and whose pool makes callers
    wait for a free connection instead of failing. Commands time out (a Redis that stopped
    answering must not hang a caller); a ``listening`` client (pub/sub) waits for messages as
    long as it takes and finds a dead connection by its health checks. A ``sentinel://`` URL
    (kombu's form, one per sentinel, ``;``-separated) reaches the primary the sentinels name
    ``sentinel_master``, and follows it when it fails over."""
    options: dict[str, Any] = {
        "socket_connect_timeout": REDIS_COMMAND_TIMEOUT_SECONDS,
        "decode_responses": True,
        "retry": RECONNECT,
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    if fail_fast:
        options |= {
            "socket_connect_timeout": FAIL_FAST_CONNECT_SECONDS,
            "retry": Retry(NoBackoff(), 0),
        }
    if listening:
        options |= {"health_check_interval": 10, "socket_keepalive": True}
    else:
        options |= {"socket_timeout": REDIS_COMMAND_TIMEOUT_SECONDS}
    if is_sentinel_url(url):
        parts = [urlsplit(part) for part in url.split(";") if part]
        nodes = [(part.hostname or "127.0.0.1", part.port or 26379) for part in parts]
        database = int(parts[0].path.strip("/") or 0)
        sentinels = Sentinel(  # type: ignore[no-untyped-call]
            nodes,
            sentinel_kwargs={"socket_timeout": REDIS_COMMAND_TIMEOUT_SECONDS},
            password=parts[0].password,
            db=database,
            **options,
        )
        primary: Redis = sentinels.master_for(
            sentinel_master,
            redis_class=Redis,
            connection_class=_SentinelConnection,
            max_connections=max_connections,
        )
        return primary
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=POOL_WAIT_SECONDS, **options
    )
    return Redis(connection_pool=pool)


def is_sentinel_url(url: str) -> bool:
    return url.startswith("sentinel://")


def answers(url: str) -> bool:
    """Whether a Redis server answers at ``url`` (one try; blocking, for a waiting process;
    for a sentinel URL, its first sentinel)."""
    if is_sentinel_url(url):
        url = "redis://" + url.split(";", maxsplit=1)[0].removeprefix("sentinel://")
    with SyncRedis.from_url(url, socket_timeout=1) as redis:
        try:
            return bool(redis.ping())
        except RedisError:
            return False


class NotReplicated(RedisConnectionError):
    """An admission was written on the primary but not acknowledged by enough replicas in
    time: it is not acknowledged to the trainer (503), who retries it."""


def sentinel_primary(sentinel_url: str, master: str) -> tuple[str, int]:
    """(host, port) of the primary a sentinel names ``master`` (blocking, one ask)."""
    with SyncRedis.from_url(sentinel_url, socket_timeout=1, decode_responses=True) as redis:
        host, port = redis.sentinel_get_master_addr_by_name(master)
    return str(host), int(port)


class RecordStore:
    """Typed access to one fleet's records, queue and fleet-wide state in Redis."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        queue: str,
        listener: Redis | None = None,
        admission_replicas: int = 0,
        replica_timeout_seconds: float = 1.0,
    ) -> None:
        self._redis = redis
        self._listener = listener or redis  # pub/sub: no command timeout
        self.keys = Keys(prefix)
        self.queue = queue
        self._scripts = _load_scripts(redis, self.keys)
        self._replicas = admission_replicas
        self._replica_timeout = replica_timeout_seconds

    @classmethod
    def connect(
        cls, settings: FleetSettings, max_connections: int | None = None, *, fail_fast: bool = False
    ) -> Self:
        """The store of the fleet ``settings`` describe, with its own connection pool. One
        that should ``fail_fast`` (a command line's) raises the first connection failure
        instead of retrying through it."""
        pool_size = max_connections or settings.redis_max_connections
        dsn, master = settings.redis_dsn, settings.sentinel_master
        listener = _client(dsn, 4, master, listening=True, fail_fast=fail_fast)
        store = _client(dsn, pool_size, master, fail_fast=fail_fast)
        return cls(
            store,
            settings.key_prefix,
            settings.queue,
            listener,
            settings.admission_replicas,
            settings.admission_replica_timeout_seconds,
        )

    async def aclose(self) -> None:
        await self._redis.aclose()
        if self._listener is not self._redis:
            await self._listener.aclose()

    async def _run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self._scripts[script](keys=list(keys), args=list(args))

    async def _pipelined(self, fill: Callable[[Pipeline], Awaitable[None]]) -> list[Any]:
        """The commands ``fill`` queues, sent in one round trip. redis-py loads a pipeline's
        scripts on the server before sending it, but its retry after a broken connection —
        on the new primary, across a failover — resends them unchecked, and a server that
        lacks one (Redis 7 does not replicate ``SCRIPT LOAD``) answers ``NoScriptError``: the
        pipeline goes once more, its scripts loaded there. Every script tolerates a rerun."""

        async def once() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                await fill(pipe)
                return await pipe.execute()

        try:
            return await once()
        except NoScriptError:
            return await once()

    async def _replicated(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """An admission script, then (when configured) ``WAIT`` on the same connection until
        ``admission_replicas`` replicas hold its writes: a rollout acknowledged to its trainer
        survives a failover to a replica."""
        if not self._replicas:
            return await self._run(script, keys, args)

        async def fill(pipe: Pipeline) -> None:
            await self._scripts[script](keys=list(keys), args=list(args), client=pipe)
            pipe.execute_command("WAIT", self._replicas, _ms(self._replica_timeout))

        reply, acknowledged = await self._pipelined(fill)
        if int(acknowledged) < self._replicas:
            raise NotReplicated(
                f"{acknowledged} of {self._replicas} replicas acknowledged the write "
                f"within {self._replica_timeout:g}s (ROLLOUT_FLEET_ADMISSION_REPLICAS)"
            )
        return reply

    async def held(self, key: RecordKey, read: RolloutRecord) -> RolloutRecord:
        """What a trainer may be told of a record it was ``read`` from (a replayed admission,
        a final result): with ``admission_replicas``, the record's status, response, result
        and lease digest read again in a call that waits until that many replicas hold them
        (else ``NotReplicated``), so what is told survives a failover; ``read`` as it is
        without. A failover since ``read`` shows here: the reply is the new primary's record
        (empty if it has none), never ``read`` confirmed by the new primary's replicas."""
        if not self._replicas:
            return read
        values = await self._replicated("confirm", [key], _HELD)
        return _record(_HELD, values or [None] * len(_HELD))  # [] if the record is gone

    async def ping(self) -> None:
        await self._redis.ping()

    @contextlib.asynccontextmanager
    async def stop_requests(self) -> AsyncIterator[AsyncIterator[RecordKey]]:
        """Subscribed to ``keys.stops`` while inside: the records whose execution must stop,
        as requests come."""
        async with self._listener.pubsub() as pubsub:
            await pubsub.subscribe(self.keys.stops)
            yield (RecordKey(data) async for data in self._published(pubsub))

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[Change]]:
        """Subscribed to ``keys.changes`` while inside: each status change, as it comes."""
        async with self._listener.pubsub() as pubsub:
            await pubsub.subscribe(self.keys.changes)
            yield (Change.read(data) async for data in self._published(pubsub))

    @staticmethod
    async def _published(pubsub: PubSub) -> AsyncIterator[str]:
        async for message in pubsub.listen():
            if message["type"] == "message":
                yield str(message["data"])

    # --- v1 admission (gateway) ---------------------------------------------------------

    async def admit_begin(self, key: RecordKey, token: str, pending_seconds: float) -> V1Admission:
        """Claim the key, or learn what is known of it. A replay (the record is there: the
        trainer retried) is what the replicas hold, as the admission itself was: the first
        answer may have been a 503 whose record never reached them. If they hold no admitted
        record (a failover lost it since the read), the caller is told to wait and begin
        again: on the new primary, the key is then claimed afresh."""
        reply = await self._run("admit_begin", [key], [token, _ms(pending_seconds)])
        if (start := AdmitStart(reply[0])) is not AdmitStart.REPLAY:
            return V1Admission(start)
        held = await self.held(key, RolloutRecord(status=Status(reply[2]), response=reply[1]))
        if held.admitted and held.response is not None:
            return V1Admission(AdmitStart.REPLAY, held.response)
        return V1Admission(AdmitStart.WAIT)

    async def admit_commit(
        self,
        key: RecordKey,
        token: str,
        ttl_seconds: float,
        message: str,
        fields: Mapping[RecordField, str],
    ) -> bool:
        """Write the record and enqueue its message in one step; False if the claim lapsed.

        With ``admission_replicas`` the message waits until the replicas hold the record: a
        commit they do not confirm in time is taken back before ``NotReplicated`` reaches the
        caller (its trainer hears 503), so a rollout its trainer was refused never runs nor
        calls back, and a retry admits it afresh. A confirmed record whose message then fails
        to go (the gateway dies) is a queued record without a message: the workers' sweeper
        resends it, as for any lost message."""
        keys = [key, self.queue]
        rollout_id = fields.get(RecordField.ROLLOUT_ID)
        if rollout_id is not None and self.keys.record("v1", rollout_id) != key:
            keys.append(self.keys.v1_alias(rollout_id))  # found by its rollout id too
        if not self._replicas:
            args = [token, _ms(ttl_seconds), message, *_flatten(fields)]
            return bool(await self._run("admit_commit", keys, args))
        args = [token, _ms(ttl_seconds), "", *_flatten(fields)]
        try:
            committed = bool(await self._replicated("admit_commit", keys, args))
        except NotReplicated:
            await self._run("admit_withdraw", [key], [token])
            raise
        if committed:
            await self._redis.lpush(self.queue, message)
        return committed

    async def admit_abort(self, key: RecordKey, token: str) -> None:
        await self._run("admit_abort", [key], [token])

    # --- v2 admission, polling (gateway) ------------------------------------------------

    async def admit_v2(
        self,
        key: RecordKey,
        *,
        max_queued: int,
        poll_lease_seconds: float,
        ttl_seconds: float,
        message: str,
        lease_digest: str,
        fields: Mapping[RecordField, str],
    ) -> AdmitOutcome:
        args = [
            max_queued,
            _ms(poll_lease_seconds),
            _ms(ttl_seconds),
            self.keys.record_id(key),
            message,
            lease_digest,
            *_flatten(fields),
        ]
        if self._replicas:  # a retry may take it over until the replicas confirm it
            args += [RecordField.UNCONFIRMED, "1"]
        outcome = AdmitOutcome(await self._replicated("admit_v2", [key, self.queue], args))
        if self._replicas and outcome is AdmitOutcome.QUEUED:
            await self._redis.hdel(key, RecordField.UNCONFIRMED)
        return outcome

    async def poll(
        self,
        key: RecordKey,
        lease_digest: str,
        *,
        poll_lease_seconds: float,
        retention_seconds: float,
        lease_expired_result: str,
    ) -> PollReply:
        """Authenticate, then the final result, or renew the polling lease and the status.
        An overdue lease finishes the rollout with ``lease_expired_result``."""
        args = [lease_digest, _ms(poll_lease_seconds), _ms(retention_seconds)]
        reply = await self._run("poll", [key], [*args, lease_expired_result])
        outcome = PollOutcome(reply[0])
        if outcome is PollOutcome.FINAL:
            # The final result as the replicas hold it; after a failover, the new primary's
            # record (unfinished there: its status is the answer; gone: unknown).
            held = await self.held(key, RolloutRecord(status=Status(reply[2]), result=reply[1]))
            if held.finished and held.result is not None:
                return PollReply(outcome, result=held.result)
            if held.status is not None:
                return PollReply(PollOutcome.STATUS, status=held.status)
            return PollReply(PollOutcome.UNKNOWN)
        if outcome is PollOutcome.STATUS:
            return PollReply(outcome, status=Status(reply[1]))
        return PollReply(outcome)

    # --- either side ----------------------------------------------------------------------

    async def load(self, key: RecordKey, *fields: RecordField) -> RolloutRecord:
        """A record (only ``fields`` of it, if given); an empty one if there is none."""
        if not fields:
            return RolloutRecord.parse(cast(dict[str, str], await self._redis.hgetall(key)))
        return _record(fields, cast(list[str | None], await self._redis.hmget(key, list(fields))))

    async def execution_of(self, key: RecordKey) -> str:
        """The execution holding ``key``'s worker lease; "" when none does (finished, waiting
        for a worker, gone)."""
        return cast(str | None, await self._redis.hget(key, RecordField.EXECUTION)) or ""

    async def cancel(
        self, cancelled_results: Mapping[RecordKey, str], retention_seconds: float
    ) -> dict[RecordKey, CancelOutcome]:
        """Cancel each rollout (pipelined). Its value is the result a queued rollout finishes
        with at once (v2), or ``""``: the worker that claims it reports the cancellation."""

        async def fill(pipe: Pipeline) -> None:
            for key, result in cancelled_results.items():
                args: list[int | str] = [_ms(retention_seconds), result]
                await self._scripts["cancel"](keys=[key], args=args, client=pipe)

        outcomes = await self._pipelined(fill)
        return {
            key: CancelOutcome(outcome)
            for key, outcome in zip(cancelled_results, outcomes, strict=True)
        }

    async def v2_ids(self, prefix: str = "") -> list[str]:
        """Rollout ids the fleet holds (admitted and not evicted), optionally by prefix."""
        if not prefix:
            return cast(list[str], await self._redis.zrangebylex(self.keys.v2_ids, "-", "+"))
        # Bytes: the byte 0xff follows every UTF-8 continuation of the prefix (as a str,
        # "\xff" would be encoded as c3 bf and miss ids going on with U+0100 and above).
        low, high = b"[" + prefix.encode(), b"[" + prefix.encode() + b"\xff"
        return cast(list[str], await self._redis.zrangebylex(self.keys.v2_ids, low, high))

    # --- fleet-wide state (gateway: health, drain, metrics) -------------------------------

    async def clock(self) -> float:
        """Redis's time, in seconds: the one clock every host of the fleet agrees on (the
        scripts use it too), so skew between hosts cannot make workers vanish or linger."""
        seconds, micros = await self._redis.time()
        return seconds + micros / 1_000_000

    async def counts(self) -> FleetCounts:
        now_ms = _ms(await self.clock())
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.active)
            pipe.zcard(self.keys.leases)
            pipe.zcount(self.keys.finished, now_ms, "+inf")
            active, running, finished = await pipe.execute()
        return FleetCounts(int(active), int(running), int(finished))

    async def active_record_ids(self) -> list[str]:
        """The record ids of every rollout admitted and not finished."""
        keys = cast(list[str], await self._redis.zrange(self.keys.active, 0, -1))
        return [self.keys.record_id(key) for key in keys]

    async def deployment_id(self, new_id: str) -> str:
        """The deployment's id: ``new_id`` if none is kept yet (Redis lost the fleet's state,
        or this is the first ask), else the kept one."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.deployment, new_id, nx=True)
            pipe.get(self.keys.deployment)
            _, deployment = await pipe.execute()
        return cast(str, deployment)

    async def fence_admissions(self, ttl_seconds: float) -> None:
        """Refuse admissions fleet-wide for ``ttl_seconds`` (a forgotten fence expires)."""
        await self._redis.set(self.keys.draining, "1", px=_ms(ttl_seconds))

    async def lift_fence(self) -> None:
        await self._redis.delete(self.keys.draining)

    async def admissions_fenced(self) -> bool:
        return bool(await self._redis.exists(self.keys.draining))

    async def fleet_figures(self) -> FleetFigures:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.llen(self.queue)
            pipe.lindex(self.queue, -1)  # kombu takes messages from this end: the oldest
            depth, oldest = await pipe.execute()
        age = 0.0
        message = read_queued(oldest) if oldest else None
        if message is not None:
            record = RecordKey(message.record)
            accepted = (await self.load(record, RecordField.ACCEPTED_AT)).accepted_at
            if accepted is not None:
                age = max(0.0, await self.clock() - accepted / 1000)
        return FleetFigures(
            queue_depth=int(depth),
            oldest_queued_seconds=round(age, 3),
            counts=await self.counts(),
            workers=await self.live_workers(),
        )

    async def data_loss_risks(self) -> list[str]:
        """What in Redis's configuration can lose admitted rollouts, each with its fix (empty:
        nothing). ``CONFIG`` may be renamed away on a managed Redis: ``INFO`` is read first."""
        memory = await self._redis.info("memory")
        persistence = await self._redis.info("persistence")
        risks = []
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction":
            risks.append(
                f"maxmemory-policy is {policy}, so under memory pressure Redis evicts records "
                "whose messages stay queued (set maxmemory-policy noeviction: the fleet then "
                "refuses admissions when full instead of losing them)"
            )
        if not int(persistence.get("aof_enabled", 0)):
            try:
                save = str((await self._redis.config_get("save")).get("save", ""))
            except ResponseError:  # CONFIG is not allowed here: snapshots cannot be told
                save = "unknown"
            if not save.strip():
                risks.append(
                    "persistence is off (appendonly no, no save points), so a restart loses "
                    "every admitted rollout (set appendonly yes)"
                )
        return risks

    async def connected_replicas(self) -> int:
        """How many replicas are connected to the primary (``INFO replication``)."""
        replication = await self._redis.info("replication")
        return int(replication.get("connected_slaves", 0))

    async def server_run(self) -> str:
        """The Redis server's run id: a new one after every restart."""
        server = await self._redis.info("server")
        return str(server.get("run_id", ""))

    async def generated_secret_key(self) -> str | None:
        """The sealing key the fleet generated for itself, if it ever ran without one."""
        return cast(str | None, await self._redis.get(self.keys.fleet_key))

    async def fleet_secret_key(self, generated: str) -> str:
        """The fleet's own sealing key: ``generated`` if none is kept yet, else the kept one."""
        await self._redis.set(self.keys.fleet_key, generated, nx=True)
        stored = await self.generated_secret_key()
        if stored is None:
            raise RuntimeError(f"the fleet key {self.keys.fleet_key} vanished from Redis")
        return stored

    async def read_key_canary(self) -> str | None:
        """The sealed key canary (``Keys.key_canary``), if any process wrote one."""
        return cast(str | None, await self._redis.get(self.keys.key_canary))

    async def write_key_canary(self, sealed: str, *, replace: bool) -> None:
        """Store the sealed key canary; unless ``replace``, only if none is stored."""
        await self._redis.set(self.keys.key_canary, sealed, nx=not replace)

    # --- read-only views (status, ls, export) -------------------------------------------

    async def find(
        self, record_id: str, protocols: Iterable[Protocol] = PROTOCOLS
    ) -> RolloutRecord | None:
        """The admitted rollout stored under ``record_id``, in the first protocol that has one;
        a v1 rollout is found by its idempotency key and by its rollout id."""
        for key in await self.keys_of(record_id, protocols):
            record = await self.load(key)
            if record.admitted:
                return record
        return None

    async def keys_of(
        self, record_id: str, protocols: Iterable[Protocol] = PROTOCOLS
    ) -> list[RecordKey]:
        """The record keys an id may name: each protocol's record of that id and, in v1,
        the record of the rollout admitted with that rollout id under another idempotency
        key (its alias, see ``schema``)."""
        keys = []
        for protocol in protocols:
            keys.append(self.keys.record(protocol, record_id))
            if protocol == "v1":
                aliased = cast(str | None, await self._redis.get(self.keys.v1_alias(record_id)))
                if aliased is not None and aliased not in keys:
                    keys.append(RecordKey(aliased))
        return keys

    async def summaries(self) -> list[RolloutRecord]:
        """The newest ``SCAN_LIMIT`` unfinished and finished rollouts, without their request
        and result."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrevrange(self.keys.active, 0, SCAN_LIMIT - 1)
            pipe.zrevrange(self.keys.finished, 0, SCAN_LIMIT - 1)
            active, finished = await pipe.execute()
        keys = list(dict.fromkeys([*active, *finished]))
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, SUMMARY_FIELDS)
            rows = await pipe.execute()
        records = (
            RolloutRecord.parse(
                {name: value for name, value in zip(SUMMARY_FIELDS, row, strict=True) if value}
            )
            for row in rows
        )
        return [record for record in records if record.admitted]  # not expired meanwhile

    async def finished_records(self, batch: int = 500) -> AsyncIterator[RolloutRecord]:
        """Every finished record the fleet still keeps, oldest first, ``batch`` at a time."""
        keys = cast(list[str], await self._redis.zrange(self.keys.finished, 0, -1))
        for start in range(0, len(keys), batch):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys[start : start + batch]:
                    pipe.hgetall(key)
                rows = cast(list[dict[str, str]], await pipe.execute())
            for fields in rows:
                record = RolloutRecord.parse(fields)
                if record.finished:
                    yield record

    # --- execution (workers) ------------------------------------------------------------

    async def claim(
        self,
        key: RecordKey,
        execution: str,
        worker: str,
        lease_seconds: float,
        max_attempts: int,
        task_id: str = "",
    ) -> Claim:
        """Take the rollout under a lease held by ``execution`` (one run of it) of ``worker``,
        delivered as Celery task ``task_id``."""
        args = [execution, worker, _ms(lease_seconds), max_attempts, task_id]
        reply = await self._run("claim", [key], args)
        verdict = Verdict(reply[0])
        if len(reply) == 1:
            return Claim(verdict)
        fields = reply[3:]
        record = RolloutRecord.parse(dict(zip(fields[::2], fields[1::2], strict=True)))
        return Claim(verdict, int(reply[1]), int(reply[2]) / 1000, record)

    async def renew(
        self, leases: Mapping[str, RecordKey], lease_seconds: float, inflight_ttl_seconds: float
    ) -> tuple[list[str], list[str]]:
        """Extend each ``execution → record`` lease still held; returns the executions that
        lost theirs, and the ones whose rollout's cancellation was requested."""
        if not leases:
            return [], []
        args = [_ms(lease_seconds), _ms(inflight_ttl_seconds), *leases]
        lost, stop = await self._run("renew", list(leases.values()), args)
        return list(lost), list(stop)

    async def advance(
        self,
        key: RecordKey,
        execution: str,
        status: Status,
        *,
        result: str = "",
        retention_seconds: float = 0,
        cancelled_result: str = "",
        fields: Mapping[RecordField, str] | None = None,
    ) -> Advance:
        """Move the rollout to ``status`` (a terminal one keeps the record ``retention_seconds``).
        If its cancellation was requested, a success (or a result about to be delivered) is
        replaced by ``cancelled_result`` when one is given."""
        args = [
            execution,
            status.value,
            result,
            _ms(retention_seconds),
            cancelled_result,
            *_flatten(fields or {}),
        ]
        return Advance(await self._run("advance", [key], args))

    async def release(
        self, key: RecordKey, execution: str, message: str, abandon: str = ""
    ) -> bool:
        """Give a rollout this worker runs back to the queue now; ``execution=""``: one it took
        but never started. ``abandon``: the reason to fail it with instead of running it again."""
        return bool(await self._run("release", [key, self.queue], [execution, message, abandon]))

    # --- worker heartbeats --------------------------------------------------------------

    async def beat(self, beat: WorkerBeat, ttl_seconds: int) -> None:
        """Announce a live worker for ``ttl_seconds`` (a silent worker drops out by itself).
        ``beat.at`` is Redis's time (:meth:`clock`), read once by the caller."""
        now = beat.at
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.worker(beat.worker), beat.model_dump_json(), ex=ttl_seconds)
            pipe.zadd(self.keys.workers, {beat.worker: now + ttl_seconds})
            pipe.zremrangebyscore(self.keys.workers, "-inf", now)
            pipe.expire(self.keys.workers, ttl_seconds)
            await pipe.execute()

    async def forget_worker(self, worker: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(worker))
            pipe.zrem(self.keys.workers, worker)
            await pipe.execute()

    async def live_workers(self) -> FleetWorkers:
        """The latest beat of every worker whose heartbeat has not lapsed."""
        now = await self.clock()
        names = cast(list[str], await self._redis.zrangebyscore(self.keys.workers, now, "+inf"))
        if not names:
            return FleetWorkers()
        beats = await self._redis.mget([self.keys.worker(name) for name in names])
        return FleetWorkers([WorkerBeat.model_validate_json(beat) for beat in beats if beat])

    # --- recovery (sweeper) -------------------------------------------------------------

    async def lapsed_leases(self, limit: int) -> list[RecordKey]:
        return list(await self._run("lapsed", [], [limit]))

    @staticmethod
    def seconds_since_trouble() -> float:
        """Seconds since this process last failed to reach Redis (a cut connection, a Redis
        stopped, restarting, loading its AOF or failing over)."""
        return time.monotonic() - BudgetedRetry.last_failure

    async def redis_uptime(self) -> float:
        """Seconds since Redis (re)started."""
        info = await self._redis.info("server")
        return float(info["uptime_in_seconds"])

    async def take(self, wait_seconds: float) -> str | None:
        """Take the oldest message off the queue (the end admissions do not push to), waiting
        up to ``wait_seconds`` for one; ``None`` if none came."""
        reply = await self._redis.brpop([self.queue], timeout=wait_seconds)
        return None if reply is None else str(reply[1])

    async def give_back(self, raw: str) -> None:
        """Put a message taken off the queue back at the end it is taken from, as it was."""
        await self._redis.rpush(self.queue, raw)

    @property
    def queue_owner_key(self) -> str:
        """The key naming the key prefix of the fleet that uses this queue (beside the queue,
        outside any fleet's prefix: fleets with different prefixes must all see it)."""
        return f"_rollout_fleet.queue_owner.{self.queue}"

    async def own_queue(self) -> tuple[str, str]:
        """Register this fleet's key prefix as the queue's user, and the queue as the
        prefix's, unless registered already; what is registered: (the queue's prefix, the
        prefix's queue), ours or another fleet's."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self.queue_owner_key, self.keys.prefix, nx=True)
            pipe.set(self.keys.fleet_queue, self.queue, nx=True)
            pipe.get(self.queue_owner_key)
            pipe.get(self.keys.fleet_queue)
            _, _, owner, queue = await pipe.execute()
        return cast(str | None, owner) or self.keys.prefix, cast(str | None, queue) or self.queue

    async def queue_owner(self) -> str | None:
        """The key prefix registered as the queue's user, if any."""
        return cast(str | None, await self._redis.get(self.queue_owner_key))

    async def holds_fleet(self) -> bool:
        """Whether a fleet with this key prefix uses this Redis database: its queue is
        registered to the prefix, or some of the prefix's fleet-wide keys exist."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self.queue_owner_key)
            pipe.exists(
                self.keys.active,
                self.keys.finished,
                self.keys.workers,
                self.keys.deployment,
                self.keys.fleet_key,
                self.keys.v2_ids,
            )
            owner, existing = await pipe.execute()
        return owner == self.keys.prefix or int(existing) > 0

    async def requeue(self, key: RecordKey, message: str) -> bool:
        return bool(await self._run("requeue", [key, self.queue], [message]))

    async def stale_deliveries(self, taken_before: float, page: int) -> list[tuple[str, RecordKey]]:
        """(delivery tag, record) of this fleet's rollout messages workers took before
        ``taken_before`` (epoch seconds) and still hold unacknowledged, whose rollout never
        started. All of them, read ``page`` at a time: with late acks the oldest entries are
        simply long-running rollouts, and a lost message may hide behind any number of them."""
        stale = []
        for start in itertools.count(0, page):
            tags = cast(
                list[str],
                await self._redis.zrangebyscore(
                    UNACKED_INDEX, "-inf", taken_before, start=start, num=page
                ),
            )
            if not tags:
                break
            entries = cast(list[str | None], await self._redis.hmget(UNACKED, tags))
            candidates = []
            for tag, entry in zip(tags, entries, strict=True):
                key = record_of_delivery(entry) if entry else None
                if key is not None and self.keys.owns(key):
                    candidates.append((tag, RecordKey(key)))
            async with self._redis.pipeline(transaction=False) as pipe:
                for _, key in candidates:
                    pipe.hget(key, RecordField.STATUS)
                statuses = await pipe.execute()
            stale += [c for c, s in zip(candidates, statuses, strict=True) if s == Status.QUEUED]
            if len(tags) < page:
                break
        return stale

    async def restore_unstarted(self, key: RecordKey, tag: str, message: str) -> bool:
        """Requeue a taken message whose rollout never started (its taker died)."""
        keys = [key, UNACKED, UNACKED_INDEX, self.queue]
        return bool(await self._run("restore", keys, [tag, message]))

    async def waiting_without_message(self, limit: int = 2000) -> set[RecordKey]:
        """Rollouts waiting for a worker whose message is neither in the queue nor among the
        messages workers took: lost on its way to a worker (kombu takes a message from the
        queue's tail and records it as taken in two steps).

        The work follows the rollouts in flight, not the backlog. Admissions push their
        message to the back of the queue in admission order (the ``active`` index's order)
        and every other push of the fleet goes to the front, so the queue reads, from the
        tail: front pushes, then admission messages oldest first. Reading from the tail up
        to the first admission message F, every rollout admitted before F either has a
        message among those read or had its admission message taken by a worker; only
        those are looked up, however long the queue behind F. A front part longer than
        ``limit`` messages (a mass requeue being worked off) skips this check. A snapshot: a
        message moving at the wrong moment makes a false suspect (the sweeper resends only on
        two checks in a row).

        Round trips do not grow with the rollouts in flight either: one ``ZMSCORE`` tells
        which candidates hold a lease (nearly all: they run), and only the others' statuses
        are read."""
        scan = await self._read_queue_tail(limit)
        if scan is None:
            return set()
        seen, admitted_before = scan
        candidates = cast(
            list[str],
            await self._redis.zrangebyscore(self.keys.active, "-inf", f"({admitted_before}"),
        )
        candidates = [key for key in candidates if key not in seen]
        if not candidates:
            return set()
        leases = await self._redis.zmscore(self.keys.leases, candidates)
        unleased = [key for key, lease in zip(candidates, leases, strict=True) if lease is None]
        if not unleased:
            return set()
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in unleased:
                pipe.hget(key, RecordField.STATUS)
            statuses = await pipe.execute()
        waiting = [key for key, status in zip(unleased, statuses, strict=True) if status in WAITING]
        if not waiting:
            return set()
        taken = set(map(record_of_delivery, cast(list[str], await self._redis.hvals(UNACKED))))
        return {RecordKey(key) for key in waiting if key not in taken}

    async def _read_queue_tail(self, limit: int) -> tuple[set[str], int] | None:
        """The records of the messages at the queue's tail up to its oldest admission, and
        the time (ms) before which every rollout admitted is behind that part; ``None`` if
        the front part is longer than ``limit`` messages. Admissions share milliseconds, so
        the read goes on past the oldest admission's millisecond: every message of a rollout
        admitted within it has been read then. Reads double in size from a few messages: the
        front part is usually empty."""
        started = _ms(await self.clock())
        seen: set[str] = set()
        oldest: int | None = None
        read, size = 0, 8
        while read < limit:
            size = min(size, limit - read)
            chunk = cast(list[str], await self._redis.lrange(self.queue, -read - size, -read - 1))
            for raw in reversed(chunk):  # from the tail
                message = read_queued(raw)
                if message is None or not self.keys.owns(message.record):
                    continue
                seen.add(message.record)
                if not message.admitted or not (at := await self._admission_time(message)):
                    continue
                if oldest is None:
                    oldest = at
                elif at > oldest:
                    return seen, oldest + 1
            if len(chunk) < size:
                return seen, started + 1  # read to the end: all of it was seen (an admission
                # in that last millisecond after the read is a suspect for one check only)
            read, size = read + size, size * 2
        return None

    async def _admission_time(self, message: QueuedMessage) -> int | None:
        """When the rollout of an admission message was admitted (ms), if the message is its
        current admission's (a record admitted again since keeps a new time)."""
        task, accepted = await self._redis.hmget(
            message.record, [RecordField.TASK, RecordField.ACCEPTED_AT]
        )
        return int(accepted) if task == message.task_id and accepted else None

    async def resend(self, key: RecordKey, message: str, guard_seconds: float) -> bool:
        """Give a waiting rollout whose message was lost a new one (once per guard period)."""
        return bool(await self._run("resend", [key, self.queue], [message, _ms(guard_seconds)]))

    async def take_turn(self, chore: str, ttl_seconds: float) -> bool:
        """True for one caller per ``ttl_seconds`` fleet-wide: chores one worker does for all."""
        return bool(await self._redis.set(self.keys.turn(chore), "1", nx=True, px=_ms(ttl_seconds)))

    async def swap_lost_suspects(self, found: set[RecordKey], ttl_seconds: float) -> set[RecordKey]:
        """Keep this check's suspects (for ``ttl_seconds``); return the previous check's."""
        key = self.keys.lost_suspects
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.smembers(key)
            pipe.delete(key)
            if found:
                pipe.sadd(key, *found)
                pipe.pexpire(key, _ms(ttl_seconds))
            previous = (await pipe.execute())[0]
        return {RecordKey(key) for key in previous}

    async def tick(self) -> tuple[int, float]:
        """This process reached Redis: the polling leases' clock ticks (``tick.lua``). How
        many outages the clock has found, and the last one's length in seconds."""
        outages, away_ms = await self._run("tick", [], [])
        return int(outages or 0), int(away_ms or 0) / 1000

    async def overdue_polls(self, limit: int) -> list[RecordKey]:
        """v2 rollouts nobody polled in time."""
        return list(await self._run("overdue_polls", [], [limit]))

    async def expire_polls(
        self, lease_expired_results: Mapping[RecordKey, str], retention_seconds: float
    ) -> int:
        """Finish each overdue rollout with its lease-expired result (pipelined), unless a
        poll came since; how many were expired."""

        async def fill(pipe: Pipeline) -> None:
            for key, result in lease_expired_results.items():
                args: list[int | str] = [result, _ms(retention_seconds)]
                await self._scripts["expire_poll"](keys=[key], args=args, client=pipe)

        expired = await self._pipelined(fill)
        return sum(map(int, expired))

    async def prune(self, inflight_ttl_seconds: float, batch: int = 1000) -> None:
        """Drop the index entries of records whose TTL ran out; renew the TTL of up to
        ``batch`` rollouts that have waited half of it (a backlog must not expire)."""
        await self._run("prune", [], [_ms(inflight_ttl_seconds), batch])


__all__ = [
    "SUMMARY_FIELDS",
    "RecordStore",
    "StoreAuthError",
    "StoreError",
    "StoreFull",
    "StoreNotRedis",
    "StoreReplyError",
    "StoreTimeout",
    "StoreUnavailable",
    "answers",
]
