"""What a store call raises when Redis fails it (gateway, worker and CLI alike catch these).

The store's callers never see redis-py's exceptions: ``connection`` turns each into one of
these, the one place that knows both. The hierarchy is what callers tell apart today — a
Redis to retry later (:class:`StoreUnavailable`: a gateway answers 503, a worker gives the
rollout back), one that is full (:class:`StoreFull`: a v2 admission hears 429), an error reply
that is a bug or a refused permission (:class:`StoreReplyError`), and for a command line
reporting the failure in one line, a timeout, refused credentials, or a server that is not
Redis at all.
"""

from __future__ import annotations


class StoreError(Exception):
    """Redis failed a store call (every failure of the store is one of these)."""


class StoreUnavailable(StoreError):
    """Redis cannot be reached now: refused or cut connections, no answer in time, a Redis
    loading its data or failing over. Worth retrying later."""


class StoreTimeout(StoreUnavailable):
    """Redis did not answer in time."""


class StoreAuthError(StoreUnavailable):
    """Redis refused the credentials (or asked for some)."""


class NotReplicated(StoreUnavailable):
    """An admission was written on the primary but not acknowledged by enough replicas in
    time: it is not acknowledged to the trainer (503), who retries it."""


class StoreReplyError(StoreError):
    """Redis answered a command with an error (a bug, or a command its ACL forbids)."""


class StoreFull(StoreReplyError):
    """Redis is at ``maxmemory`` and refuses writes."""


class NoHeadroom(StoreFull):
    """Redis has not the room the rollouts admitted and not finished need to end (their
    results, renewals and sweeps): admissions are refused as at ``maxmemory`` until it has
    (``rollout_gateway/headroom.py``)."""


class WriteRefused(StoreError):
    """Redis, still answering, refused one write of a rollout: it is full, the value is
    larger than it takes, or it cut the connection the write went on. The worker holding the
    rollout is alive: this is no crash, and the rollout ends saying so."""


class StoreNotRedis(StoreError):
    """The server answered in another protocol than Redis's."""


__all__ = [
    "NoHeadroom",
    "NotReplicated",
    "StoreAuthError",
    "StoreError",
    "StoreFull",
    "StoreNotRedis",
    "StoreReplyError",
    "StoreTimeout",
    "StoreUnavailable",
    "WriteRefused",
]
