"""The store's failures reach its callers as the store's own exceptions, never redis-py's:
a Redis that is down, full, asking for a password, a server that is not Redis, an error
reply, each against a real server (or a real socket that speaks something else)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis import Redis as SyncRedis
from redis.exceptions import RedisError, ResponseError

from rollout_core.settings import FleetSettings
from rollout_core.store import AdmitOutcome, RecordField, RecordStore, errors
from rollout_core.store.connection import store_error
from rollout_fleet.processes import free_port
from rollout_fleet.redis_server import RedisServer

pytestmark = pytest.mark.anyio


def connected(url: str) -> RecordStore:
    """A store that reports the first failure (as the CLI's does) instead of riding it out."""
    settings = FleetSettings(redis_url=url, key_prefix="t", queue="q", secret_key=None)
    return RecordStore.connect(settings, fail_fast=True)


def only_the_stores(error: BaseException) -> None:
    """What the caller caught is the store's exception, not redis-py's."""
    assert isinstance(error, errors.StoreError)
    assert not isinstance(error, RedisError)


@pytest.fixture
async def down() -> AsyncIterator[RecordStore]:
    store = connected(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    yield store
    await store.aclose()


async def test_a_redis_that_is_down_is_unavailable_to_every_kind_of_call(
    down: RecordStore,
) -> None:
    key = down.keys.record("v2", "r")
    calls = {
        "command": down.ping(),
        "pipeline": down.counts(),
        "script": down.admit_abort(key, "tok"),
        "pipelined scripts": down.cancel({key: ""}, 60),
    }
    for name, call in calls.items():
        with pytest.raises(errors.StoreUnavailable) as caught:
            await call
        only_the_stores(caught.value)
        assert "Connection refused" in str(caught.value) or "connect" in str(caught.value), name


async def test_a_subscription_to_a_redis_that_is_down_is_unavailable(down: RecordStore) -> None:
    async def first_change() -> None:
        async with down.changes() as changes:
            async for _ in changes:
                break

    with pytest.raises(errors.StoreUnavailable) as caught:
        await first_change()
    only_the_stores(caught.value)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer(password="right").start()
    yield server
    server.stop()


async def admit(store: RecordStore) -> AdmitOutcome:
    return await store.admit_v2(
        store.keys.record("v2", "r"),
        max_queued=10,
        polling_lease_seconds=60,
        ttl_seconds=60,
        message="MSG",
        lease_digest="d",
        fields={RecordField.PROTOCOL: "v2"},
    )


async def test_a_full_redis_refuses_writes_as_full(own_server: RedisServer) -> None:
    store = connected(own_server.url)
    admin = SyncRedis.from_url(own_server.url)
    admin.config_set("maxmemory", "1")
    try:
        with pytest.raises(errors.StoreFull) as by_script:
            await admit(store)
        with pytest.raises(errors.StoreFull) as by_command:
            await store.fence_admissions(60)
        for caught in (by_script, by_command):
            only_the_stores(caught.value)
            assert isinstance(caught.value, errors.StoreReplyError)
            assert not isinstance(caught.value, errors.StoreUnavailable)
        await store.ping()  # reads still go
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()
        await store.aclose()
    store = connected(own_server.url)
    try:  # room again: the same admission goes through
        assert await admit(store) is AdmitOutcome.QUEUED
    finally:
        await store.aclose()


async def test_a_refused_password_is_an_auth_error(own_server: RedisServer) -> None:
    for url in (
        own_server.url.replace(":right@", ""),  # none given: NOAUTH
        own_server.url.replace(":right@", ":wrong@"),
    ):
        store = connected(url)
        try:
            with pytest.raises(errors.StoreAuthError) as caught:
                await store.ping()
        finally:
            await store.aclose()
        only_the_stores(caught.value)
        assert isinstance(caught.value, errors.StoreUnavailable)  # a gateway answers 503
        assert "wrong" not in str(caught.value)  # no secret in the error


async def test_an_error_reply_is_a_reply_error(own_server: RedisServer) -> None:
    store = connected(own_server.url)
    admin = SyncRedis.from_url(own_server.url)
    key = store.keys.record("v1", "r")
    admin.set(key, "not a hash")
    try:
        with pytest.raises(errors.StoreReplyError) as caught:
            await store.load(key)
    finally:
        admin.close()
        await store.aclose()
    only_the_stores(caught.value)
    assert not isinstance(caught.value, (errors.StoreFull, errors.StoreUnavailable))
    assert "WRONGTYPE" in str(caught.value)


async def test_a_server_that_speaks_another_protocol_is_not_redis() -> None:
    async def http(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    server = await asyncio.start_server(http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = connected(f"redis://127.0.0.1:{port}/0")
    try:
        with pytest.raises(errors.StoreError) as caught:
            await store.ping()
    finally:
        await store.aclose()
        server.close()
    only_the_stores(caught.value)
    # redis-py reads the first reply's line as a protocol error, or the cut connection after it
    assert isinstance(caught.value, (errors.StoreNotRedis, errors.StoreUnavailable))


def test_a_script_refused_for_memory_by_redis_6_is_full_too() -> None:
    """Redis 6 wraps a script's OOM in a script error, not in an OOM reply."""
    error = ResponseError(
        "Error running script (call to f_0123): @user_script:12: @user_script: 12: "
        "-OOM command not allowed when used memory > 'maxmemory'."
    )
    assert isinstance(store_error(error), errors.StoreFull)
    assert str(store_error(error)) == str(error)
    assert type(store_error(ResponseError("WRONGTYPE"))) is errors.StoreReplyError


def test_the_kinds_callers_tell_apart() -> None:
    """A timeout and refused credentials are kinds of unavailability (a gateway's 503); a
    full Redis is an error reply, not an outage."""
    from redis.exceptions import AuthenticationError, ConnectionError, TimeoutError

    assert type(store_error(TimeoutError("slow"))) is errors.StoreTimeout
    assert type(store_error(AuthenticationError("no"))) is errors.StoreAuthError
    assert type(store_error(ConnectionError("cut"))) is errors.StoreUnavailable
    assert issubclass(errors.StoreTimeout, errors.StoreUnavailable)
    assert issubclass(errors.StoreAuthError, errors.StoreUnavailable)
    assert not issubclass(errors.StoreFull, errors.StoreUnavailable)
