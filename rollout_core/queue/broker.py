"""kombu's Redis transport, made to survive broken connections (``broker_transport``).

Found by the chaos suite (``CLIENT KILL`` of every connection, three times in a run): a worker
could stop consuming for good while its process looked healthy. Two defects combine:

* redis-py retries a command on a broken connection by reconnecting underneath kombu. For the
  broadcast (pub/sub) connection that means re-subscribing and then blocking the consumer's
  event loop in ``recv`` until some broadcast arrives, so acks, heartbeats and new messages
  all wait. Celery already recovers from a broken connection by restarting the consumer;
  here redis-py does not retry, so it can.
* An ack whose connection is broken raises before kombu frees the prefetch slot; a few of
  those and the consumer never asks for work again. Here the slot is freed whatever happens:
  the message stays in Redis's ``unacked`` set, comes back after the visibility timeout, and
  the rollout's claim drops it (it is already finished).

And one found by a Redis restart: closing the broken connection, kombu gives the messages
this worker took back to the queue — over that same broken connection. It raised, and Celery
took it for an unrecoverable error and stopped the worker. Here a failed give-back is logged.

A worker keeps the messages it took in its memory only. kombu's ack emulation would also copy
each into Redis (``unacked``, a ``MULTI`` with ``ZADD`` + ``HSET`` on taking it, another with
``ZREM`` + ``HDEL`` on the ack: 8 of a rollout's Redis commands), so that a message whose
worker died comes back after the visibility timeout. The fleet does not need that copy: a
rollout its worker started holds a lease the sweeper takes back within a lease, and one whose
message was taken and never started (its worker died within the few milliseconds in between)
is found by the lost-message check and resent (``rollout_worker/sweeper.py``). The in-memory
bookkeeping stays: it is what limits a worker to its prefetch (its concurrency), and what a
closing connection or a reject gives back to the queue.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis
from redis import sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

TRANSPORT = "rollout_core.queue.broker:Transport"
SENTINEL_TRANSPORT = "rollout_core.queue.broker:SentinelTransport"


def _no_retry(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {**kwargs, "retry": Retry(NoBackoff(), 0)}


class Connection(redis.Connection):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**_no_retry(kwargs))  # type: ignore[no-untyped-call]


class SSLConnection(redis.SSLConnection):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**_no_retry(kwargs))


# AttributeError: kombu building a client for a connection it already closed.
BROKEN = (redis.RedisError, AttributeError)


class QoS(kombu_redis.QoS):
    """Taken messages are kept in the worker's memory only (see the module)."""

    def append(self, message: Any, delivery_tag: str) -> None:
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """A task that lost Redis rejects its message for requeue: it goes back to the
        queue's front if Redis answers now; across a failover the channel's connection may
        be closed by then, and a raise here stopped the worker (the nemesis's sentinel
        stage): the slot is freed whatever happens, and the lost-message check resends."""
        try:
            if requeue:
                self._give_back([delivery_tag])
        finally:
            virtual.QoS.ack(self, delivery_tag)

    def restore_unacked(self, client: Any = None) -> None:
        """The connection closes (a stop, a reconnection): the messages taken and not acked
        go back to the queue's front (a rollout already running turns its copy away)."""
        try:
            self._give_back(list(self._delivered or ()), client)
        finally:
            if self._delivered is not None:
                self._delivered.clear()

    def _give_back(self, tags: list[str], client: Any = None) -> None:
        delivered: dict[str, Any] = dict(self._delivered or {})
        taken = [delivered[tag] for tag in tags if tag in delivered]
        if not taken:
            return
        try:
            with self.channel.conn_or_acquire(client) as redis_client:  # type: ignore[attr-defined]
                for message in taken:
                    delivery = message.delivery_info
                    self.channel._do_restore_message(  # type: ignore[attr-defined]
                        message._raw, delivery["exchange"], delivery["routing_key"], redis_client
                    )
        except BROKEN as exc:
            logger.warning(
                "could not give %d taken message(s) back to the queue (%s); the lost-message "
                "check resends their rollouts",
                len(taken),
                type(exc).__name__,
            )


class Channel(kombu_redis.Channel):
    QoS = QoS
    connection_class = Connection
    connection_class_ssl = SSLConnection


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelConnection(sentinel.SentinelManagedConnection):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**_no_retry(kwargs))  # type: ignore[no-untyped-call]


class SentinelChannel(kombu_redis.SentinelChannel):
    """The same hardening, on connections to the primary the sentinels name."""

    QoS = QoS
    connection_class = SentinelConnection


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


# On a failover kombu moves to the URL's next alternate and picks that URL's transport by its
# scheme: "sentinel" must name ours, or the worker continues on kombu's unhardened one.
TRANSPORT_ALIASES["sentinel"] = SENTINEL_TRANSPORT


def transport_for(url: str) -> str:
    """The broker transport for a ``REDIS_URL``: ours, in its sentinel form if need be."""
    return SENTINEL_TRANSPORT if url.startswith("sentinel://") else TRANSPORT


__all__ = ["SENTINEL_TRANSPORT", "TRANSPORT", "SentinelTransport", "Transport", "transport_for"]
