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
took it for an unrecoverable error and stopped the worker. Here the messages stay in
``unacked`` for the sweeper, which requeues the ones never started (``rollout_worker/sweeper.py``).
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
    def restore_unacked(self, client: Any = None) -> None:
        try:
            super().restore_unacked(client)
        except BROKEN as exc:
            logger.warning(
                "could not give taken messages back to the queue (%s); the sweeper will",
                type(exc).__name__,
            )
            if self._delivered is not None:
                self._delivered.clear()

    def ack(self, delivery_tag: str) -> None:
        try:
            self._remove_from_indices(delivery_tag).execute()  # type: ignore[attr-defined]
        except BROKEN as exc:
            logger.warning(
                "ack of %s not recorded (%s); the message returns after the visibility "
                "timeout and is dropped as already finished",
                delivery_tag,
                type(exc).__name__,
            )
        finally:
            virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """A task that lost Redis rejects its message (requeue): across a failover the
        channel's connection may be closed by then, and kombu's raise stopped the worker
        (the nemesis's sentinel stage). The message stays taken in Redis for the sweeper."""
        try:
            super().reject(delivery_tag, requeue=requeue)
        except BROKEN as exc:
            logger.warning(
                "reject of %s not recorded (%s); the message stays taken, for the sweeper",
                delivery_tag,
                type(exc).__name__,
            )
            virtual.QoS.ack(self, delivery_tag)


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
