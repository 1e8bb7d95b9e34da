"""Polling leases in one process (PROTOCOL.md §2.7; upstream's
``osmosis_ai.rollout.server.lease``).

A lease is minted at admission; every poll renews it. A rollout whose lease runs out is
reported to ``on_expired`` as soon as the deadline passes, without waiting for a poll, so its
execution can be stopped. Only a digest of each token is kept, compared in constant time.
The token helpers are also the fleet gateway's, which keeps its leases in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

OnExpired = Callable[[str], Awaitable[None]]


def new_lease_token() -> str:
    """32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def lease_digest(token: str) -> str:
    """Servers keep only this digest of a lease token."""
    return hashlib.sha256(token.encode()).hexdigest()


def lease_matches(token: str, digest: str) -> bool:
    return hmac.compare_digest(lease_digest(token), digest)


class UnknownLeaseError(KeyError):
    """No lease is registered for this rollout id."""


class InvalidLeaseError(PermissionError):
    """The token is not this rollout's lease."""


@dataclass
class _Lease:
    digest: str
    deadline: float  # event-loop time
    renewed: asyncio.Event = field(default_factory=asyncio.Event)
    watcher: asyncio.Task[None] | None = None
    watching: bool = True


class LeaseManager:
    """The leases of one server, by rollout id; deadlines are ``timeout_sec`` after
    registration or the latest renewal."""

    def __init__(self, *, timeout_sec: float, on_expired: OnExpired) -> None:
        if not (math.isfinite(timeout_sec) and timeout_sec > 0):
            raise ValueError("timeout_sec must be finite and greater than zero")
        self.timeout_sec = timeout_sec
        self._on_expired = on_expired
        self._leases: dict[str, _Lease] = {}

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def register(self, rollout_id: str, token: str) -> None:
        """Start the rollout's lease (call from the event loop). ``ValueError`` if it has one."""
        if rollout_id in self._leases:
            raise ValueError(f"lease already registered for {rollout_id}")
        lease = _Lease(lease_digest(token), self._now() + self.timeout_sec)
        self._leases[rollout_id] = lease
        lease.watcher = asyncio.create_task(self._watch(rollout_id, lease))

    def authenticate(self, rollout_id: str, token: str) -> None:
        """``UnknownLeaseError`` / ``InvalidLeaseError`` unless ``token`` is the lease."""
        self._authenticated(rollout_id, token)

    def renew(self, rollout_id: str, token: str) -> bool:
        """Move the deadline to now + timeout; False (nothing renewed) once it has passed."""
        lease = self._authenticated(rollout_id, token)
        now = self._now()
        if now >= lease.deadline:
            return False
        lease.deadline = now + self.timeout_sec
        lease.renewed.set()
        return True

    def expired(self, rollout_id: str) -> bool:
        return self._now() >= self._lease(rollout_id).deadline

    def finish(self, rollout_id: str) -> None:
        """Stop watching the deadline (the rollout finished); the token still authenticates."""
        lease = self._leases.get(rollout_id)
        if lease is not None:
            self._stop(lease)

    def remove(self, rollout_id: str) -> None:
        """Forget the lease (the rollout was evicted)."""
        lease = self._leases.pop(rollout_id, None)
        if lease is not None:
            self._stop(lease)

    async def close(self) -> None:
        """Forget every lease and wait for the watchers to end."""
        watchers = [lease.watcher for lease in self._leases.values() if lease.watcher]
        for lease in self._leases.values():
            self._stop(lease)
        self._leases.clear()
        await asyncio.gather(*watchers, return_exceptions=True)

    async def _watch(self, rollout_id: str, lease: _Lease) -> None:
        """Sleep until the deadline (waking on renewals); report an expiry once, then stop."""
        while lease.watching:
            lease.renewed.clear()
            remaining = lease.deadline - self._now()
            if remaining <= 0:
                lease.watching = False
                try:
                    await self._on_expired(rollout_id)
                except Exception:
                    logger.exception("lease expiry handler failed for rollout %s", rollout_id)
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await lease.renewed.wait()

    def _authenticated(self, rollout_id: str, token: str) -> _Lease:
        lease = self._lease(rollout_id)
        if not lease_matches(token, lease.digest):
            raise InvalidLeaseError(rollout_id)
        return lease

    def _lease(self, rollout_id: str) -> _Lease:
        try:
            return self._leases[rollout_id]
        except KeyError:
            raise UnknownLeaseError(rollout_id) from None

    @staticmethod
    def _stop(lease: _Lease) -> None:
        lease.watching = False
        lease.renewed.set()
        watcher = lease.watcher
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()


__all__ = [
    "InvalidLeaseError",
    "LeaseManager",
    "UnknownLeaseError",
    "lease_digest",
    "lease_matches",
    "new_lease_token",
]
