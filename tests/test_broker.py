"""Our kombu Redis transport (``rollout_core/queue/broker.py``) against a real redis-server:
a worker keeps the messages it took in memory only (no ``unacked`` copy in Redis), its
prefetch still holds, a closing connection or a reject gives them back to the queue's front,
and a Redis that went away under it does not make closing raise (Celery would stop the
worker): a message that could not be given back is the lost-message check's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Queue
from kombu.message import Message

from rollout_core.queue.broker import TRANSPORT
from rollout_core.store.schema import UNACKED
from rollout_fleet.redis_server import RedisServer


@pytest.mark.parametrize("transport", [TRANSPORT, None], ids=["ours", "kombu's"])
def test_a_vanished_redis_does_not_break_closing(transport: str | None) -> None:
    server = RedisServer(appendonly=True).start()
    connection = Connection(server.url, transport=transport)
    queue = Queue("q")
    taken: list[Message] = []

    def take(_: Any, message: Message) -> None:
        taken.append(message)

    with connection.Producer() as producer:
        producer.publish({"n": 1}, routing_key="q", declare=[queue])
    consumer = connection.Consumer([queue], callbacks=[take], prefetch_count=1)
    consumer.consume()
    connection.drain_events(timeout=5)
    assert len(taken) == 1
    server.stop()
    try:
        if transport is None:
            with pytest.raises(redis.ConnectionError):  # what stopped Celery workers
                consumer.channel.qos.restore_unacked()
            return
        consumer.channel.qos.restore_unacked()
        taken[0].ack()
        server.start()  # same port and AOF: nothing of the message is left in Redis
        client = redis.Redis.from_url(server.url)
        assert (client.hlen(UNACKED), client.llen("q")) == (0, 0)
    finally:
        connection.release()
        server.stop()


@pytest.mark.parametrize("transport", [TRANSPORT, None], ids=["ours", "kombu's"])
def test_a_reject_for_requeue_on_a_closed_channel_does_not_stop_the_worker(
    transport: str | None,
) -> None:
    """Found by the nemesis's sentinel stage: a task that lost Redis across a failover rejects
    its message for requeue on a channel whose connection is closed by then; kombu raised
    (``AttributeError``) and Celery stopped the worker. Ours frees the slot and leaves the
    message to the lost-message check."""
    server = RedisServer(appendonly=True).start()
    connection = Connection(server.url, transport=transport)
    queue = Queue("q")
    taken: list[Message] = []
    with connection.Producer() as producer:
        producer.publish({"n": 1}, routing_key="q", declare=[queue])
    consumer = connection.Consumer(
        [queue], callbacks=[lambda _, m: taken.append(m)], prefetch_count=1
    )
    consumer.consume()
    connection.drain_events(timeout=5)
    qos = consumer.channel.qos
    server.stop()  # Redis went away under the task (a failover, a restart)
    try:
        if transport is None:
            with pytest.raises((AttributeError, redis.RedisError)):  # stopped Celery workers
                qos.reject(taken[0].delivery_tag, requeue=True)
            return
        qos.reject(taken[0].delivery_tag, requeue=True)
        assert qos.can_consume()  # the prefetch slot is free: the worker takes more work
        server.start()
        client = redis.Redis.from_url(server.url)
        assert (client.hlen(UNACKED), client.llen("q")) == (0, 0)
    finally:
        connection.release()
        server.stop()


def _commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}


@contextlib.contextmanager
def consuming(
    transport: str | None, messages: int
) -> Iterator[tuple[Connection, list[Message], redis.Redis]]:
    """A Redis with ``messages`` queued on ``q``, consumed with one prefetch slot: the
    connection, the messages taken (none yet) and a client of that Redis."""
    server = RedisServer().start()
    connection = Connection(server.url, transport=transport)
    queue = Queue("q")
    taken: list[Message] = []
    client = redis.Redis.from_url(server.url)
    try:
        with connection.Producer() as producer:
            for n in range(messages):
                producer.publish({"n": n}, routing_key="q", declare=[queue])
        consumer = connection.Consumer(
            [queue], callbacks=[lambda _, m: taken.append(m)], prefetch_count=1
        )
        consumer.consume()
        yield connection, taken, client
    finally:
        client.close()
        connection.release()
        server.stop()


@pytest.mark.parametrize("transport", [TRANSPORT, None], ids=["ours", "kombu's"])
def test_taking_and_acking_a_message_writes_nothing_but_the_take(transport: str | None) -> None:
    """Issue 17: kombu copies each taken message into ``unacked`` and deletes it on the ack
    (two MULTIs: 8 commands a rollout); ours keeps it in memory. The prefetch limit holds
    either way: with one slot, a second message waits until the first is acked."""
    with consuming(transport, 2) as (connection, taken, client):
        before = _commands(client)
        connection.drain_events(timeout=5)
        qos = connection.default_channel.qos
        assert (len(taken), qos.can_consume(), client.llen("q")) == (1, False, 1)
        taken[0].ack()
        assert qos.can_consume()
        written = {
            name: count - before.get(name, 0)
            for name, count in _commands(client).items()
            if name in ("multi", "zadd", "hset", "zrem", "hdel") and count > before.get(name, 0)
        }
        if transport is None:
            assert written == {"multi": 2, "zadd": 1, "hset": 1, "zrem": 1, "hdel": 1}
        else:
            assert written == {}
            assert client.hlen(UNACKED) == 0


@pytest.mark.parametrize("how", ["closing", "reject"])
def test_a_taken_message_goes_back_to_the_front_of_the_queue(how: str) -> None:
    """A closing connection (Celery's stop, a reconnection) and a reject for requeue put the
    taken message back where the next take finds it first, marked redelivered, once."""
    with consuming(TRANSPORT, 3) as (connection, taken, client):
        connection.drain_events(timeout=5)
        assert taken[0].payload == {"n": 0}
        qos = connection.default_channel.qos
        if how == "closing":
            qos.restore_unacked()
        else:
            qos.reject(taken[0].delivery_tag, requeue=True)
        assert qos.can_consume()
        queued = [json.loads(raw) for raw in client.lrange("q", 0, -1)]
        assert len(queued) == 3
        front = queued[-1]  # the next BRPOP takes from the right
        assert front["properties"]["delivery_info"]["redelivered"] is True
        assert front["properties"]["delivery_tag"] == taken[0].delivery_tag
