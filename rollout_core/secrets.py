"""Keeping trainer API keys out of stored records, logs and error messages.

A rollout's ``api_key`` must reach the worker that runs it, but the record it travels in is
plain Redis data. It is sealed with Fernet (AES + HMAC) under the fleet key
``ROLLOUT_FLEET_SECRET_KEY`` and dropped from the record when the rollout finishes. Without a
configured key the fleet generates one and keeps it in Redis beside the data, which keeps
secrets out of dumps and greps but is obfuscation, not protection: set the variable in
production. Keys rotate without losing queued rollouts: ``NEW,OLD`` seals with ``NEW`` and
still opens what ``OLD`` sealed (:class:`~cryptography.fernet.MultiFernet`).
"""

from __future__ import annotations

import logging

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from rollout_core.settings import FleetSettings
from rollout_core.store import RecordStore

logger = logging.getLogger(__name__)

REDACTED = "***"


class SecretUnreadable(ValueError):
    """A sealed secret none of this process's keys opens."""


class SecretBox:
    def __init__(self, keys: str | bytes) -> None:
        """``keys``: one Fernet key, or several comma-separated (the first one seals)."""
        text = keys.decode("ascii") if isinstance(keys, bytes) else keys
        self._fernet = MultiFernet([Fernet(key.strip()) for key in text.split(",") if key.strip()])

    def seal(self, secret: str) -> str:
        return self._fernet.encrypt(secret.encode()).decode("ascii")

    def open(self, sealed: str) -> str:
        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode()
        except (InvalidToken, ValueError) as exc:
            raise SecretUnreadable(
                "the trainer's API key was sealed with a ROLLOUT_FLEET_SECRET_KEY this process "
                "does not have (the key was rotated without keeping the old one after the new, "
                "or gateways and workers were given different keys)"
            ) from exc


async def load_secret_box(store: RecordStore, settings: FleetSettings) -> SecretBox:
    """The configured key, else the fleet's generated one (created by whoever asks first).
    A fleet that ran on a generated key and is then given its own (as the warning asks) still
    opens what the generated key sealed: it is always tried after the configured ones, so
    the rollouts queued before the change run."""
    if settings.secret_key is not None:
        configured = settings.secret_key.get_secret_value()
        generated = await store.generated_secret_key()
        if generated is None:
            return SecretBox(configured)
        logger.info(
            "the key this fleet generated before ROLLOUT_FLEET_SECRET_KEY was set still opens "
            "what it sealed (it never seals again)"
        )
        return SecretBox(f"{configured},{generated}")
    stored = await store.fleet_secret_key(Fernet.generate_key().decode("ascii"))
    logger.warning(
        "ROLLOUT_FLEET_SECRET_KEY is not set: trainer API keys are sealed with a key kept in "
        "Redis (obfuscation only). Set it to a Fernet key for real protection; rollouts "
        "already sealed with the generated key stay readable."
    )
    return SecretBox(stored)


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every occurrence of the given secrets replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


__all__ = ["REDACTED", "SecretBox", "SecretUnreadable", "load_secret_box", "redact"]
