"""Refusing a Redis that can lose admitted rollouts, or that cannot confirm them.

Two settings of Redis lose work the fleet has acknowledged, silently: an eviction policy other
than ``noeviction`` (the records carry TTLs, so under memory pressure Redis drops them while
their queue messages survive: the claim finds nothing and the trainer never hears back), and
no persistence at all (a restart forgets everything). Every gateway and worker checks at start
and refuses to run on either, unless the operator says, by a setting nobody sets by accident,
that losing rollouts is acceptable. A running process checks again whenever Redis was
restarted since it last looked (its run id changed), so a Redis brought back without
persistence is noticed: a gateway's ``/ready`` fails naming it, and gateways and workers log
it once.

With ``ROLLOUT_FLEET_ADMISSION_REPLICAS`` every admission waits for that many replicas: a
primary with fewer connected ones answers every admission 503. A gateway refuses to start on
one, and its ``/ready`` fails while it lasts (a replica outage), naming both counts and the
setting.

Fleets with different key prefixes on one Redis database must not share a queue name: each
one's workers would take the other's messages. Each fleet registers its prefix for its queue
at start (a key beside the queue); a process whose queue another prefix holds refuses to
start, and a gateway's ``/ready`` fails if that changes while it runs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass

from rollout_core.settings import SHORT_RECORD_TTL, FleetSettings
from rollout_core.store import RecordStore, StoreReplyError, StoreUnavailable
from rollout_core.store.schema import RESERVED_NAMES, RESERVED_PREFIXES

logger = logging.getLogger(__name__)

OVERRIDE = "ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS"
REPLICAS_SETTING = "ROLLOUT_FLEET_ADMISSION_REPLICAS"


class StartRefused(RuntimeError):
    """This Redis cannot serve the fleet as configured; the message is one line naming the
    problem and its fix."""


class RedisLosesData(StartRefused):
    """Redis is configured to drop admitted rollouts; the message names each risk and its fix."""


class TooFewReplicas(StartRefused):
    """The primary has fewer connected replicas than admissions wait for."""


def _data_loss_refusal(risks: list[str]) -> str:
    return (
        f"Redis can lose admitted rollouts: {'; '.join(risks)}. To run anyway, accepting the "
        f"loss, set {OVERRIDE}=true."
    )


async def refuse_data_loss(store: RecordStore, settings: FleetSettings) -> None:
    """Raise :class:`RedisLosesData` if Redis can lose admitted rollouts (a loud warning
    instead with the override). A Redis that does not answer yet is checked by the next
    process to start, and by this one once it answers (:class:`RedisWatch`)."""
    try:
        risks = await store.data_loss_risks()
    except StoreUnavailable as exc:
        logger.warning("Redis did not answer the durability check at start: %r", exc)
        return
    if not risks:
        return
    if settings.allow_redis_data_loss:
        logger.warning("Redis can lose admitted rollouts (%s=true): %s", OVERRIDE, "; ".join(risks))
        return
    raise RedisLosesData(f"refusing to run: {_data_loss_refusal(risks)}")


async def replica_shortfall(store: RecordStore, settings: FleetSettings) -> str | None:
    """Why admissions cannot be confirmed by enough replicas, with the fix; None if they can."""
    required = settings.admission_replicas
    if not required:
        return None
    connected = await store.connected_replicas()
    if connected >= required:
        return None
    return (
        f"{connected} of the {required} replicas {REPLICAS_SETTING} requires are connected to "
        f"the Redis primary, so every admission answers 503: start or reconnect replicas, or "
        f"set {REPLICAS_SETTING}={connected} (at most the replicas that run)"
    )


async def refuse_too_few_replicas(store: RecordStore, settings: FleetSettings) -> None:
    """Raise :class:`TooFewReplicas` if the primary has fewer replicas than admissions need
    (a Redis that does not answer yet: the gateway's ``/ready`` says so once it does)."""
    try:
        shortfall = await replica_shortfall(store, settings)
    except StoreUnavailable as exc:
        logger.warning("Redis did not answer the replica check at start: %r", exc)
        return
    if shortfall is not None:
        raise TooFewReplicas(f"refusing to run: {shortfall}")


class SharedQueue(StartRefused):
    """Another fleet (another key prefix) uses this fleet's queue."""


async def queue_conflict(store: RecordStore) -> str | None:
    """Why this fleet's queue is not its own, or its prefix's fleet uses another queue, with
    the fix; None if both agree (registering them if nobody has). A Redis whose ACL forbids
    the registration keys cannot tell: None, with a warning."""
    try:
        clash = await queue_name_clash(store)
        if clash is not None:
            return clash
        owner, queue = await store.own_queue()
    except StoreReplyError as exc:
        logger.warning("cannot register the queue's key prefix in Redis (%s): not checked", exc)
        return None
    if queue != store.queue:
        return (
            f"the fleet with key prefix {store.keys.prefix!r} uses the queue {queue!r}, and "
            f"this process has {store.queue!r}: each would take the other's rollouts for lost "
            "and resend them. Give every process of one fleet the same ROLLOUT_FLEET_QUEUE "
            "(or this one its own ROLLOUT_FLEET_KEY_PREFIX); if the old queue is gone for "
            f"good, delete the Redis key {store.keys.fleet_queue}"
        )
    if owner == store.keys.prefix:
        return None
    return (
        f"the queue {store.queue!r} is used by the fleet with key prefix {owner!r}, and this "
        f"one has {store.keys.prefix!r}: their workers would take each other's rollouts. Give "
        "each fleet its own ROLLOUT_FLEET_QUEUE (or the same ROLLOUT_FLEET_KEY_PREFIX if they "
        f"are one fleet); if that fleet is gone, delete the Redis key {store.queue_owner_key}"
    )


async def queue_name_clash(store: RecordStore) -> str | None:
    """Why this fleet's queue name is a key that holds other data, with the fix: Celery's,
    the fleet's own registry, or any fleet's key space (a script meeting a list where it
    keeps a sorted set fails halfway); None if it is not."""
    queue, prefix = store.queue, store.keys.prefix
    pick = "Pick a ROLLOUT_FLEET_QUEUE outside every fleet's key prefix"
    if queue in RESERVED_NAMES or queue.startswith(RESERVED_PREFIXES):
        return (
            f"the queue name {queue!r} is a key Celery or the fleet keeps other data under "
            f"({', '.join(RESERVED_NAMES)}, {'*, '.join(RESERVED_PREFIXES)}*). {pick}"
        )
    fleets = {prefix: queue, **{p: q for q, p in (await store.registered_queues()).items()}}
    for other_prefix, other_queue in fleets.items():
        if queue.startswith(f"{other_prefix}:"):
            return (
                f"the queue name {queue!r} lies among the keys of the fleet with key prefix "
                f"{other_prefix!r}, which would meet a list where it keeps other data. {pick}"
            )
        if other_queue.startswith(f"{prefix}:"):
            return (
                f"the fleet with key prefix {other_prefix!r} uses the queue {other_queue!r}, "
                f"among this fleet's keys ({prefix}:...): give this fleet another "
                "ROLLOUT_FLEET_KEY_PREFIX"
            )
    return None


async def refuse_shared_queue(store: RecordStore) -> None:
    """Raise :class:`SharedQueue` if another key prefix holds this fleet's queue."""
    try:
        conflict = await queue_conflict(store)
    except StoreUnavailable as exc:
        logger.warning("Redis did not answer the queue check at start: %r", exc)
        return
    if conflict is not None:
        raise SharedQueue(f"refusing to run: {conflict}")


class MixedSettings(StartRefused):
    """This process's shared settings differ from the ones the fleet's live processes have."""


API_KEY = "ROLLOUT_FLEET_API_KEY"
_GATEWAY_KEY_NOTE = b"rollout-fleet: the API key gateways require"


def _api_key_print(settings: FleetSettings) -> str:
    """What the gateways' API key is compared by: an HMAC keyed with it (nothing a reader of
    Redis can use), or "" for none."""
    if settings.api_key is None:
        return ""
    key = settings.api_key.get_secret_value().encode()
    return hmac.new(key, _GATEWAY_KEY_NOTE, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Agreement:
    """What this process must agree on with the fleet's live ones, by the key it is kept
    under: every process's :attr:`FleetSettings.shared` and agent (a worker serving another
    agent ran rollouts admitted with this one's tools); every gateway's API key (a replica
    with another key, or none, admitted what the others refuse)."""

    parts: tuple[tuple[str, dict[str, float | str]], ...]

    @classmethod
    def of(
        cls, store: RecordStore, settings: FleetSettings, agent: str, *, admits: bool
    ) -> Agreement:
        every: dict[str, float | str] = {**settings.shared, "AGENT": agent}
        parts = [(store.keys.shared_settings, every)]
        if admits:
            parts.append((store.keys.gateway_settings, {API_KEY: _api_key_print(settings)}))
        return cls(tuple(parts))

    async def differences(self, store: RecordStore, ttl_seconds: float) -> list[str]:
        """How this process differs from the fleet, one line per value; storing its values
        as the fleet's, and keeping them, where none are stored (the first process, or they
        lapsed while Redis was away)."""
        differ = []
        for key, ours in self.parts:
            stored = await store.share_settings(key, json.dumps(ours, sort_keys=True), ttl_seconds)
            theirs = json.loads(stored)
            differ += [
                _difference(name, value, theirs[name], key)
                for name, value in ours.items()
                if name in theirs and theirs[name] != value
            ]
        return differ


def _difference(name: str, ours: float | str, theirs: float | str, key: str) -> str:
    if name == API_KEY:
        return f"{name} is not the one the fleet's running gateways require ({key})"
    shown = [f"{value:g}" if isinstance(value, float) else repr(value) for value in (ours, theirs)]
    return f"{name}={shown[0]} here, {shown[1]} in the fleet's running processes ({key})"


async def refuse_mixed_settings(
    store: RecordStore, settings: FleetSettings, agreement: Agreement
) -> None:
    """Raise :class:`MixedSettings` unless this process agrees with the fleet's live ones
    (:class:`Agreement`: values stored by the first of them, kept while any lives)."""
    try:
        differ = await agreement.differences(store, settings.shared_ttl)
    except StoreUnavailable as exc:
        logger.warning("Redis did not answer the shared-settings check at start: %r", exc)
        return
    if differ:
        raise MixedSettings(
            f"refusing to start: {'; '.join(differ)}: give every gateway and worker of one "
            "fleet the same values; to change them, stop the whole fleet first (its values "
            "lapse three leases after its last process stops)"
        )


class SettingsKeeper:
    """A running process keeps what the fleet agrees on stored (stores it again if it
    lapsed, as it does when Redis is away longer than its TTL) and says, once per change,
    if the stored values are not its own: a process that started while they had lapsed."""

    def __init__(self, store: RecordStore, settings: FleetSettings, agreement: Agreement) -> None:
        self._store, self._ttl, self._agreement = store, settings.shared_ttl, agreement
        self._told: list[str] = []

    async def keep(self) -> None:
        differ = await self._agreement.differences(self._store, self._ttl)
        if differ and differ != self._told:
            logger.error(
                "the fleet's shared settings are not this process's: %s. A process started "
                "with other values while they had lapsed; restart it with this fleet's values",
                "; ".join(differ),
            )
        self._told = differ


async def start_checks(
    store: RecordStore, settings: FleetSettings, agreement: Agreement, *, admits: bool
) -> None:
    """Every check a process makes of Redis before it serves (:class:`StartRefused` if one
    fails); ``admits``: a gateway, which also needs the replicas admissions wait for."""
    await refuse_data_loss(store, settings)
    await refuse_shared_queue(store)
    await refuse_mixed_settings(store, settings, agreement)
    if settings.record_ttl < SHORT_RECORD_TTL:
        logger.warning(
            "ROLLOUT_FLEET_RECORD_TTL_SECONDS=%g: a finished rollout is forgotten that soon, so "
            "a trainer retrying its admission later runs it again, called back under a new "
            "Idempotency-Key (at least %g is the SDK's own bound)",
            settings.record_ttl,
            SHORT_RECORD_TTL,
        )
    if admits:
        await refuse_too_few_replicas(store, settings)


class RedisWatch:
    """A running process's view of Redis's durability: the data-loss check, run again only
    when Redis restarted since the last one (a cheap ``INFO server`` tells)."""

    def __init__(self, store: RecordStore, settings: FleetSettings) -> None:
        self._store = store
        self._settings = settings
        self._checked_run: str | None = None
        self._risks: list[str] = []

    async def data_loss(self) -> str | None:
        """Why Redis can now lose admitted rollouts, with the fix; None if it cannot (or the
        override accepts it). Raises the store's errors when Redis does not answer."""
        run = await self._store.server_run()
        if run != self._checked_run:
            risks = await self._store.data_loss_risks()
            accepted = self._settings.allow_redis_data_loss
            if risks and risks != self._risks and not accepted:
                logger.error("%s", _data_loss_refusal(risks))
            self._risks, self._checked_run = risks, run
        if not self._risks or self._settings.allow_redis_data_loss:
            return None
        return _data_loss_refusal(self._risks)


__all__ = [
    "API_KEY",
    "OVERRIDE",
    "Agreement",
    "MixedSettings",
    "RedisLosesData",
    "RedisWatch",
    "SettingsKeeper",
    "SharedQueue",
    "StartRefused",
    "TooFewReplicas",
    "queue_conflict",
    "refuse_data_loss",
    "refuse_shared_queue",
    "refuse_too_few_replicas",
    "replica_shortfall",
    "start_checks",
]
