"""Our kombu Redis transport (``rollout_worker/broker.py``) against a real redis-server that
goes away under it: closing the broken connection must not raise (Celery would stop the
worker), and the messages the worker took stay in Redis for the sweeper."""

from __future__ import annotations

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
        server.start()  # same port and AOF: the taken message waits for the sweeper
        assert redis.Redis.from_url(server.url).hlen(UNACKED) == 1
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
    message taken, for the sweeper."""
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
        server.start()  # same port and AOF: the taken message waits for the sweeper
        assert redis.Redis.from_url(server.url).hlen(UNACKED) == 1
    finally:
        connection.release()
        server.stop()
