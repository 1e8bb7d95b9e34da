"""Inbound server keys for v1 (PROTOCOL.md §1.2): generation, extraction and comparison."""

from __future__ import annotations

import hmac
import secrets

API_KEY_PREFIX = "osm_rollout_"


def generate_api_key() -> str:
    """``osm_rollout_`` + URL-safe base64 of 32 random bytes (43 characters)."""
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def validate_api_key(provided: str | None, expected: str | None) -> bool:
    """Constant-time, case-sensitive equality; ``None`` on either side never matches."""
    if provided is None or expected is None:
        return False
    return hmac.compare_digest(provided.encode(), expected.encode())


def extract_token(authorization: str | None) -> str | None:
    """``Bearer <t>`` (any case) gives ``<t>``; any other non-empty value is the token itself."""
    if authorization is None:
        return None
    value = authorization.strip()
    if not value:
        return None
    parts = value.split()
    if len(parts) == 2 and parts[0].lower() == "bearer":
        return parts[1]
    return value


def is_authorized(authorization: str | None, expected: str | None) -> bool:
    """True when no key is configured, or the header carries the configured key."""
    if expected is None:
        return True
    return validate_api_key(extract_token(authorization), expected)


__all__ = [
    "API_KEY_PREFIX",
    "extract_token",
    "generate_api_key",
    "is_authorized",
    "validate_api_key",
]
