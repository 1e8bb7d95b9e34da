"""kombu's Redis transport, made to survive broken connections (``broker_transport``).

Found by the chaos suite (``CLIENT KILL`` of every connection, three times in a run): a worker
could stop consuming for good while its process looked healthy: redis-py retries a command
on a broken connection by reconnecting underneath kombu. For the broadcast (pub/sub)
connection that means re-subscribing and then blocking the consumer's event loop in
``recv`` until some broadcast arrives, so heartbeats, task events and revokes all wait.
Celery already recovers from a broken connection by restarting the consumer; here redis-py
does not retry, so it can.

Workers take rollout messages themselves (``rollout_worker/intake.py``); Celery's consumer
in a worker reads no queue, only its control broadcasts (revokes), and publishes heartbeats
and task events. So kombu's ack emulation (its ``unacked`` copy of every taken message) is
never used by the fleet; the sweeper still recovers a message another kind of Celery
consumer left there (``rollout_worker/sweeper.py``).
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from redis import sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

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


class Channel(kombu_redis.Channel):
    connection_class = Connection
    connection_class_ssl = SSLConnection


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelConnection(sentinel.SentinelManagedConnection):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**_no_retry(kwargs))  # type: ignore[no-untyped-call]


class SentinelChannel(kombu_redis.SentinelChannel):
    """The same hardening, on connections to the primary the sentinels name."""

    connection_class = SentinelConnection


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


# On a failover kombu moves to the URL's next alternate and picks that URL's transport by its
# scheme: "sentinel" must name ours, or the worker continues on kombu's unhardened one.
TRANSPORT_ALIASES["sentinel"] = SENTINEL_TRANSPORT


def transport_for(url: str) -> str:
    """The broker transport for a ``REDIS_URL``: ours, in its sentinel form if need be."""
    return SENTINEL_TRANSPORT if url.startswith("sentinel://") else TRANSPORT


def control_exchange(key_prefix: str) -> str:
    """The exchange a fleet's remote control (ping, revoke, shutdown) travels over: one per
    fleet, since Redis's pub/sub spans a server's databases."""
    return f"{key_prefix}.celery"


def event_exchange(key_prefix: str) -> str:
    """The exchange a fleet's task events (what Flower shows) travel over."""
    return f"{key_prefix}.celeryev"


__all__ = [
    "SENTINEL_TRANSPORT",
    "TRANSPORT",
    "SentinelTransport",
    "Transport",
    "control_exchange",
    "event_exchange",
    "transport_for",
]
