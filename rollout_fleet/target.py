"""The fleet ``rollout-fleet status``, ``ls``, ``cancel`` and ``export`` read, and every way
reading it fails, each told in one line with its fix.

The fleet is the one ``REDIS_URL`` (or ``ROLLOUT_FLEET_REDIS_URL``, or a ``.env`` file) names,
else the newest ``rollout-fleet up`` this user runs (:mod:`rollout_fleet.state`). With
neither, the CLI says so instead of reading a default address: whatever answers there (another
program's Redis) would report "0 rollouts" or "never admitted" for a fleet it never held.
Redis URLs are shown with their password masked.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rollout_fleet import state

if TYPE_CHECKING:
    from rollout_core.settings import FleetSettings
    from rollout_core.store import RecordStore

MASK = "***"
URL_VARIABLES = ("ROLLOUT_FLEET_REDIS_URL", "REDIS_URL")  # the settings' order of precedence
SET_URL = "set REDIS_URL to the fleet's Redis"


class FleetUnreadable(Exception):
    """The CLI cannot read the fleet; the message is one line naming the problem and its fix
    (never a password)."""


def masked(url: str) -> str:
    """``url`` (or a ``;``-separated list of sentinel URLs) with any password replaced by
    ``***``, in the userinfo or in a ``password=`` query parameter."""
    return ";".join(_masked_one(part) for part in url.split(";"))


def _masked_one(url: str) -> str:
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:  # an unparsable port: show no part that could hold a secret
        return f"{url.partition('://')[0]}://{MASK}"
    netloc = parts.netloc
    if has_password:
        user = netloc.rpartition("@")[0].partition(":")[0]
        netloc = f"{user}:{MASK}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, MASK if k.lower() == "password" else v) for k, v in pairs], safe="*/"
        )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


@dataclass(frozen=True)
class FleetTarget:
    """The fleet the CLI reads: its settings (Redis URL, key prefix) and where they came from."""

    settings: FleetSettings
    source: str  # "REDIS_URL", "settings (.env)", "rollout-fleet up, pid 123", ...

    @property
    def redis(self) -> str:
        """The Redis URL, password masked."""
        return masked(self.settings.redis_dsn)

    def where(self) -> str:
        return f"{self.redis} (from {self.source})"

    def describe(self) -> str:
        """The line the CLI prints (on stderr) before reading."""
        return f"fleet: key prefix {self.settings.key_prefix!r} on {self.where()}"


def find_target(settings: FleetSettings) -> FleetTarget:
    """The fleet to read: the Redis URL the settings were given, else the newest running
    ``rollout-fleet up``'s Redis and key prefix. Raises :class:`FleetUnreadable` with
    neither."""
    from pydantic import SecretStr

    if "redis_url" in settings.model_fields_set:
        return FleetTarget(settings, url_source(settings))
    fleets = state.running()
    if not fleets:
        raise FleetUnreadable(
            "no fleet to read: REDIS_URL is not set and no rollout-fleet up runs here; set "
            "REDIS_URL=redis://HOST:PORT/DB (and ROLLOUT_FLEET_KEY_PREFIX if not rf), or start "
            "one with rollout-fleet up"
        )
    newest = fleets[0]
    source = f"rollout-fleet up, pid {newest.pid}"
    if len(fleets) > 1:
        source += f", the newest of {len(fleets)}: set REDIS_URL to choose"
    update: dict[str, object] = {"redis_url": SecretStr(newest.redis_url)}
    if "key_prefix" not in settings.model_fields_set:
        update["key_prefix"] = newest.key_prefix
    return FleetTarget(settings.model_copy(update=update), source)


def url_source(settings: FleetSettings) -> str:
    """Where the settings' Redis URL came from: the variable that set it, a ``.env`` file,
    or the default."""
    if "redis_url" not in settings.model_fields_set:
        return "the default"
    given = [name for name in URL_VARIABLES if os.environ.get(name)]
    return given[0] if given else "settings (.env)"


async def check_fleet(store: RecordStore, target: FleetTarget) -> None:
    """Raise :class:`FleetUnreadable` unless Redis answers within the fail-fast connect
    timeout and holds a fleet with the target's key prefix."""
    from rollout_core.store.connection import FAIL_FAST_CONNECT_SECONDS

    try:
        async with asyncio.timeout(FAIL_FAST_CONNECT_SECONDS):
            await store.ping()
        if await store.holds_fleet():
            return
        owner = await store.queue_owner()
    except Exception as exc:
        raise unreadable(exc, target) from None
    prefix = target.settings.key_prefix
    if owner is not None:
        raise FleetUnreadable(
            f"no fleet with key prefix {prefix!r} on {target.where()}: the fleet there uses "
            f"key prefix {owner!r}; set ROLLOUT_FLEET_KEY_PREFIX={owner}"
        )
    raise FleetUnreadable(
        f"no fleet on {target.where()}: no fleet with key prefix {prefix!r} ever ran there; "
        f"{SET_URL} (and ROLLOUT_FLEET_KEY_PREFIX to its prefix)"
    )


def unreadable(exc: BaseException, target: FleetTarget) -> FleetUnreadable:
    """``exc``, raised while reading the fleet, as one line naming the problem and its fix.
    Redis's own messages are shown with the password taken out."""
    from rollout_core.store import (
        StoreAuthError,
        StoreError,
        StoreNotRedis,
        StoreReplyError,
        StoreTimeout,
        StoreUnavailable,
    )
    from rollout_core.store.connection import FAIL_FAST_CONNECT_SECONDS

    where = target.where()
    if isinstance(exc, StoreAuthError) or "NOAUTH" in str(exc):
        problem = "refused the password" if _passwords(target) else "wants a password"
        line = (
            f"Redis at {where} {problem}; put the fleet's password in REDIS_URL: "
            "redis://:PASSWORD@HOST:PORT/DB"
        )
    elif isinstance(exc, (TimeoutError, StoreTimeout)):
        line = (
            f"cannot reach Redis at {where}: no answer within {FAIL_FAST_CONNECT_SECONDS:g} s; "
            f"check that it runs and the network reaches it, or {SET_URL}"
        )
    elif isinstance(exc, StoreUnavailable):
        line = f"cannot reach Redis at {where}: {_reason(exc, target)}; start it, or {SET_URL}"
    elif isinstance(exc, StoreNotRedis):
        line = (
            f"the server at {where} is not a Redis server (it answered in another protocol); "
            f"{SET_URL}"
        )
    elif isinstance(exc, StoreReplyError):
        line = (
            f"Redis at {where} refused to answer ({_said(exc, target)}); check REDIS_URL's "
            "database and user"
        )
    elif isinstance(exc, ValueError):  # redis-py's verdict on the URL's form
        line = (
            f"not a Redis URL: {where} ({_said(exc, target)}); use redis://[:PASSWORD@]HOST:PORT/DB"
        )
    elif isinstance(exc, (StoreError, OSError)):
        line = f"cannot read the fleet on {where}: {_said(exc, target)}"
    else:
        raise exc
    return FleetUnreadable(line)


def _passwords(target: FleetTarget) -> list[str]:
    """The passwords in the target's Redis URL (one per sentinel URL)."""
    found = []
    for part in target.settings.redis_dsn.split(";"):
        try:
            password = urlsplit(part).password
        except ValueError:
            continue
        if password:
            found.append(password)
    return found


def _said(exc: BaseException, target: FleetTarget) -> str:
    """What ``exc`` says, without the Redis password (a URL in a message may carry it)."""
    text = str(exc).strip().rstrip(".") or type(exc).__name__
    for password in _passwords(target):
        text = text.replace(password, MASK)
    return text


def _reason(exc: BaseException, target: FleetTarget) -> str:
    """Why a connection failed, in a few words when the operating system said why (the
    store's error is caused by the client's, which is caused by the system's)."""
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return "its host name does not resolve"
        if isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED:
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    return _said(exc, target)


__all__ = [
    "FleetTarget",
    "FleetUnreadable",
    "check_fleet",
    "find_target",
    "masked",
    "unreadable",
    "url_source",
]
