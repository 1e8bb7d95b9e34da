"""FastAPI pieces shared by every v1 server (the in-process app and the fleet gateway)."""

from __future__ import annotations

from fastapi import HTTPException

from rollout_sdk.server.api_key import is_authorized

INVALID_KEY_DETAIL = "Invalid or missing API key"


def require_v1_key(authorization: str | None, expected: str | None) -> None:
    """401 unless the request carries the configured key (call after body validation)."""
    if not is_authorized(authorization, expected):
        raise HTTPException(status_code=401, detail=INVALID_KEY_DETAIL)


def require_platform_key(authorization: str | None, expected: str | None) -> None:
    """``/platform/health``: 404 without a configured key, 401 on a bad one."""
    if expected is None:
        raise HTTPException(status_code=404, detail="Not found")
    require_v1_key(authorization, expected)


__all__ = ["INVALID_KEY_DETAIL", "require_platform_key", "require_v1_key"]
