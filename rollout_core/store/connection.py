"""How the store reaches Redis (gateway, worker and CLI alike): the clients, their retry through
outages bounded in time, the Sentinel connection that follows a failover, and how a script or
a pipeline of them is sent. Kept apart so the roles' modules read as what they do, not as how
a command survives a broken connection.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any
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

from rollout_core.settings import REDIS_COMMAND_TIMEOUT_SECONDS
from rollout_core.store import errors
from rollout_core.store.schema import Keys, lua_prelude
from rollout_core.store.scripts import PRELUDE, Script

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


def store_error(error: RedisError) -> errors.StoreError:
    """The store's exception for redis-py's ``error`` (same message). Redis 6 reports a
    script's write refused at ``maxmemory`` as a script error, not as OOM: it is full too."""
    kind: type[errors.StoreError]
    if isinstance(error, AuthenticationError):  # a kind of ConnectionError: first
        kind = errors.StoreAuthError
    elif isinstance(error, RedisTimeoutError):
        kind = errors.StoreTimeout
    elif isinstance(error, RedisConnectionError):
        kind = errors.StoreUnavailable
    elif isinstance(error, OutOfMemoryError) or "OOM command not allowed" in str(error):
        kind = errors.StoreFull
    elif isinstance(error, ResponseError):
        kind = errors.StoreReplyError
    elif isinstance(error, InvalidResponse):
        kind = errors.StoreNotRedis
    else:
        kind = errors.StoreError
    return kind(str(error))


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """redis-py's exceptions raised inside, as the store's. A script missing on the server
    passes as it is: the script's caller loads it and runs it again (see :func:`pipelined`)."""
    try:
        yield
    except NoScriptError:
        raise
    except RedisError as error:
        # A full Redis is no trouble for sweepers: the scripts that renew leases, finish and
        # repair rollouts run at ``maxmemory`` too (scripts.py), so no lease lapses for it.
        raise store_error(error) from error


class StoreClient(Redis):
    """redis-py's client, whose failures are the store's exceptions. Its connections retry
    below this (:class:`BudgetedRetry` and :class:`_SentinelConnection` see redis-py's own
    exceptions); only what reaches the caller is translated."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        with translated():
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> StorePipeline:
        return StorePipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class StorePipeline(Pipeline):
    """A pipeline of a :class:`StoreClient`, failing as it does."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        with translated():
            return await super().execute(raise_on_error)


async def run(script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """One script run (loaded on the server first if it lacks it)."""
    try:
        return await script(keys=list(keys), args=list(args))
    except NoScriptError as error:  # lost again between the load and the run
        raise store_error(error) from error


def load_scripts(redis: Redis, keys: Keys, flags: bool) -> dict[Script, AsyncScript]:
    """The fleet's scripts, registered on ``redis`` (loaded on the server at their first
    run); ``flags``: as a Redis that reads script flags (7.0 on) runs them."""
    prelude = lua_prelude(keys) + PRELUDE.read_text()
    return {script: redis.register_script(script.text(prelude, flags)) for script in Script}


async def reads_script_flags(redis: Redis) -> bool:
    """Whether the server reads script flags (``#!lua flags=``): Redis 7.0 on."""
    server = await redis.info("server")
    major = str(server.get("redis_version", "0")).split(".", 1)[0]
    return major.isdigit() and int(major) >= 7


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


def client(
    url: str,
    max_connections: int,
    sentinel_master: str,
    *,
    listening: bool = False,
    fail_fast: bool = False,
) -> StoreClient:
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
        primary: StoreClient = sentinels.master_for(
            sentinel_master,
            redis_class=StoreClient,
            connection_class=_SentinelConnection,
            max_connections=max_connections,
        )
        return primary
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=POOL_WAIT_SECONDS, **options
    )
    return StoreClient(connection_pool=pool)


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


def sentinel_primary(sentinel_url: str, master: str) -> tuple[str, int]:
    """(host, port) of the primary a sentinel names ``master`` (blocking, one ask)."""
    with (
        translated(),
        SyncRedis.from_url(sentinel_url, socket_timeout=1, decode_responses=True) as redis,
    ):
        host, port = redis.sentinel_get_master_addr_by_name(master)
    return str(host), int(port)


async def pipelined(redis: Redis, fill: Callable[[Pipeline], Awaitable[None]]) -> list[Any]:
    """The commands ``fill`` queues, sent in one round trip. redis-py loads a pipeline's
    scripts on the server before sending it, but its retry after a broken connection —
    on the new primary, across a failover — resends them unchecked, and a server that
    lacks one (Redis 7 does not replicate ``SCRIPT LOAD``) answers ``NoScriptError``: the
    pipeline goes once more, its scripts loaded there. Every script tolerates a rerun."""

    async def once() -> list[Any]:
        async with redis.pipeline(transaction=False) as pipe:
            await fill(pipe)
            return await pipe.execute()

    try:
        return await once()
    except NoScriptError:
        try:
            return await once()
        except NoScriptError as error:
            raise store_error(error) from error


@contextlib.asynccontextmanager
async def subscribed(listener: Redis, channel: str) -> AsyncIterator[AsyncIterator[str]]:
    """Subscribed to ``channel`` while inside: the messages published on it, as they come."""
    with translated():
        async with listener.pubsub() as pubsub:
            await pubsub.subscribe(channel)
            yield _published(pubsub)


async def _published(pubsub: PubSub) -> AsyncIterator[str]:
    with translated():
        async for message in pubsub.listen():
            if message["type"] == "message":
                yield str(message["data"])


__all__ = [
    "FAIL_FAST_CONNECT_SECONDS",
    "RETRY_BUDGET_SECONDS",
    "AsyncScript",
    "BudgetedRetry",
    "Pipeline",
    "StoreClient",
    "StorePipeline",
    "answers",
    "client",
    "is_sentinel_url",
    "load_scripts",
    "pipelined",
    "reads_script_flags",
    "run",
    "sentinel_primary",
    "store_error",
    "subscribed",
    "translated",
]
