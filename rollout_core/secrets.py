"""Keeping trainer API keys out of stored records, logs and error messages.

A rollout's ``api_key`` must reach the worker that runs it, but the record it travels in is
plain Redis data. It is sealed with Fernet (AES + HMAC) under the fleet key
``ROLLOUT_FLEET_SECRET_KEY`` and dropped from the record when the rollout finishes. Without a
configured key the fleet generates one and keeps it in Redis beside the data, which keeps
secrets out of dumps and greps but is obfuscation, not protection: set the variable in
production. Keys rotate without losing queued rollouts: ``NEW,OLD`` seals with ``NEW`` and
still opens what ``OLD`` sealed (:class:`~cryptography.fernet.MultiFernet`).

Gateways and workers must share the key, so gateways seal a known value, the *key canary*,
under ``<prefix>:key-canary`` as they start (the first worker does if no gateway did), and a
worker that cannot open it refuses to start, saying so: otherwise each rollout it took would
fail with an unreadable record.

Logs: while a worker holds a rollout, its key is *hidden* (:func:`hiding`): every line the
process logs shows ``***`` in its place, in the message and in a traceback alike, whoever
logs it (the agent, the SDK, a library); :class:`HiddenSecretsFilter` does it on the fleet's
log handler.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import re
import threading
import traceback
from collections import Counter
from collections.abc import Iterator

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from rollout_core.durability import StartRefused
from rollout_core.settings import FleetSettings
from rollout_core.store import RecordStore, StoreFull

logger = logging.getLogger(__name__)

REDACTED = "***"
CANARY = "rollout-fleet key canary"  # the known value the key canary seals
KEYS_DIFFER = (
    "refusing to start: this worker's ROLLOUT_FLEET_SECRET_KEY does not open what the fleet's "
    "gateways seal (the key canary {key}), so it could run none of their rollouts: set the "
    "same ROLLOUT_FLEET_SECRET_KEY on gateways and workers (while rotating, NEW,OLD on both)"
)

GATEWAY_KEY_DIFFERS = (
    "refusing to start: this gateway's ROLLOUT_FLEET_SECRET_KEY does not open the key canary "
    "{key} that this fleet's {workers} live workers opened, so they could run none of the "
    "rollouts it admits: set the same ROLLOUT_FLEET_SECRET_KEY on gateways and workers (while "
    "rotating, NEW,OLD on both)"
)


GATEWAY_KEY_NEW_TO_WORKERS = (
    "refusing to start: this gateway seals with a ROLLOUT_FLEET_SECRET_KEY that {workers} of "
    "this fleet's live workers do not hold, so they could run none of the rollouts it admits: "
    "to rotate, give every worker NEW,OLD first, then the gateways"
)
_KEY_PRINT_NOTE = b"rollout-fleet: a secret key a process holds"


class SecretUnreadable(ValueError):
    """A sealed secret none of this process's keys opens."""


class KeysDiffer(StartRefused):
    """This process cannot open the key canary the rest of the fleet holds."""


class SecretBox:
    def __init__(self, keys: str | bytes) -> None:
        """``keys``: one Fernet key, or several comma-separated (the first one seals)."""
        text = keys.decode("ascii") if isinstance(keys, bytes) else keys
        raw = [key.strip().encode("ascii") for key in text.split(",") if key.strip()]
        fernets = [Fernet(key) for key in raw]
        self._sealer = fernets[0]
        self._fernet = MultiFernet(fernets)
        # What a worker's beat says it holds, and a gateway compares its sealing key with: an
        # HMAC keyed with each key (nothing a reader of Redis can use).
        self.prints = [hmac.new(key, _KEY_PRINT_NOTE, hashlib.sha256).hexdigest() for key in raw]

    def seal(self, secret: str) -> str:
        return self._fernet.encrypt(secret.encode()).decode("ascii")

    def opens_canary(self, sealed: str, *, sealer_only: bool = False) -> bool:
        """Whether ``sealed`` is the key canary under one of this box's keys (``sealer_only``:
        under the key it seals with)."""
        fernet = self._sealer if sealer_only else self._fernet
        try:
            return fernet.decrypt(sealed.encode("ascii")).decode() == CANARY
        except (InvalidToken, ValueError):
            return False

    def open(self, sealed: str) -> str:
        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode()
        except (InvalidToken, ValueError) as exc:
            raise SecretUnreadable(
                "the trainer's API key was sealed with a ROLLOUT_FLEET_SECRET_KEY this process "
                "does not have (the key was rotated without keeping the old one after the new, "
                "or gateways and workers were given different keys)"
            ) from exc


async def load_secret_box(
    store: RecordStore, settings: FleetSettings, *, quiet: bool = False
) -> SecretBox:
    """The configured key, else the fleet's generated one (created by whoever asks first).
    A fleet that ran on a generated key and is then given its own (as the warning asks) still
    opens what the generated key sealed: it is always tried after the configured ones, so
    the rollouts queued before the change run. ``quiet``: logs nothing (a check before the
    process starts, which logs it then)."""
    if settings.secret_key is not None:
        configured = settings.secret_key.get_secret_value()
        generated = await store.generated_secret_key()
        if generated is None:
            return SecretBox(configured)
        if not quiet:
            logger.info(
                "the key this fleet generated before ROLLOUT_FLEET_SECRET_KEY was set still "
                "opens what it sealed (it never seals again)"
            )
        return SecretBox(f"{configured},{generated}")
    stored = await store.fleet_secret_key(Fernet.generate_key().decode("ascii"))
    if quiet:
        return SecretBox(stored)
    logger.warning(
        "ROLLOUT_FLEET_SECRET_KEY is not set: trainer API keys are sealed with a key kept in "
        "Redis (obfuscation only). Set it to a Fernet key for real protection; rollouts "
        "already sealed with the generated key stay readable."
    )
    return SecretBox(stored)


async def keep_key_canary(store: RecordStore, box: SecretBox) -> None:
    """A gateway starting: make the key canary one this gateway sealed with its sealing key,
    unless it already is. One sealed with an older key of this gateway's (a rotation: NEW,OLD)
    is replaced only if every live worker holds the new key (its beat's key prints); else this
    gateway refuses to start. A canary it cannot open at all is another key's: while workers that
    opened it live, this gateway refuses to start (:class:`KeysDiffer`), since they could open
    nothing it admits; with none live, the fleet is starting over on a new key, and the canary
    is replaced (logged): what gateways seal is what workers must open."""
    sealed = await store.read_key_canary()
    if sealed is not None and box.opens_canary(sealed, sealer_only=True):
        return
    if sealed is not None:
        workers = (await store.live_workers()).beats
        if box.opens_canary(sealed):  # sealed with an older key of ours: a rotation
            lacking = [beat for beat in workers if box.prints[0] not in beat.keys]
            if lacking:
                raise KeysDiffer(GATEWAY_KEY_NEW_TO_WORKERS.format(workers=len(lacking)))
        elif workers:
            key = store.keys.key_canary
            raise KeysDiffer(GATEWAY_KEY_DIFFERS.format(key=key, workers=len(workers)))
        else:
            logger.warning(
                "the key canary %s was sealed with a ROLLOUT_FLEET_SECRET_KEY this gateway "
                "does not have, and no worker is live: replaced with this gateway's; workers "
                "without its key refuse to start",
                store.keys.key_canary,
            )
    try:
        await store.write_key_canary(box.seal(CANARY), replace=True)
    except StoreFull:  # a full Redis refuses admissions anyway; the next start writes it
        logger.warning("the key canary could not be written: Redis is full (maxmemory)")


async def check_key_canary(store: RecordStore, box: SecretBox) -> None:
    """A worker starting: raise :class:`KeysDiffer` unless it opens the key canary (sealed
    first by this worker if no gateway has yet; none at all, on a full Redis: nothing to
    compare with)."""
    with contextlib.suppress(StoreFull):
        await store.write_key_canary(box.seal(CANARY), replace=False)
    sealed = await store.read_key_canary()
    if sealed is not None and not box.opens_canary(sealed):
        raise KeysDiffer(KEYS_DIFFER.format(key=store.keys.key_canary))


# A secret shorter than this is hidden only where it stands alone, not inside a longer run of
# letters, digits and underscores: a one-letter key turned "returned" into "r***turn***d",
# unreadable and showing where the key's letter is.
WHOLE_WORD_BELOW = 16


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every occurrence of the given secrets replaced by ``***`` (a short one's
    only where it stands alone)."""
    for secret in secrets:
        if not secret:
            continue
        if len(secret) >= WHOLE_WORD_BELOW:
            text = text.replace(secret, REDACTED)
        else:
            alone = rf"(?<!\w){re.escape(secret)}(?!\w)"
            text = re.sub(alone, REDACTED, text)
    return text


class _Hidden:
    """The secrets this process's log lines must not show. Written on the event loop, read by
    any thread that logs: readers take an immutable snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uses: Counter[str] = Counter()
        self.now: tuple[str, ...] = ()

    def add(self, secret: str) -> None:
        with self._lock:
            self._uses[secret] += 1
            self.now = tuple(self._uses)

    def remove(self, secret: str) -> None:
        with self._lock:
            self._uses[secret] -= 1
            if self._uses[secret] <= 0:
                del self._uses[secret]
            self.now = tuple(self._uses)


_hidden = _Hidden()


@contextlib.contextmanager
def hiding(secret: str | None) -> Iterator[None]:
    """While the block runs, every line this process logs shows ``***`` for ``secret`` (any
    task, thread or logger: an agent's exception quoting its key is logged by code that never
    saw the key)."""
    if not secret:
        yield
        return
    _hidden.add(secret)
    try:
        yield
    finally:
        _hidden.remove(secret)


class HiddenSecretsFilter(logging.Filter):
    """Replaces every hidden secret (:func:`hiding`) in a record's message, traceback and
    stack with ``***``. On a handler, so it sees every logger's lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = _hidden.now
        if not secrets:
            return True
        message = record.getMessage()
        shown = redact(message, *secrets)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            # Formatted here, once, so the formatter prints the redacted text instead.
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact(record.exc_text, *secrets)
            record.exc_info = None
        if record.stack_info:
            record.stack_info = redact(record.stack_info, *secrets)
        return True


__all__ = [
    "CANARY",
    "GATEWAY_KEY_DIFFERS",
    "GATEWAY_KEY_NEW_TO_WORKERS",
    "REDACTED",
    "HiddenSecretsFilter",
    "KeysDiffer",
    "SecretBox",
    "SecretUnreadable",
    "check_key_canary",
    "hiding",
    "keep_key_canary",
    "load_secret_box",
    "redact",
]
