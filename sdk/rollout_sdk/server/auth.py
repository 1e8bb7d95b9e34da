"""The server key, checked once per request, each generation its own way.

* v1 (P§1.2): ``Bearer <key>`` in any case, or the raw key; checked *after* the body is
  validated (an unauthenticated bad body is a 422), and only on the routes that need it.
  :class:`V1ServerKey` is a FastAPI dependency for those routes.
* v2 (P§2.2): exactly ``Bearer <key>``, on every route (unknown paths and the docs too), before
  anything else: :func:`require_bearer` installs it as the outermost check of the app.

A server builds the one its generation needs when it builds its app.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rollout_sdk.server.api_key import is_authorized

INVALID_KEY_DETAIL = "Invalid or missing API key"

AuthorizationHeader = Annotated[str | None, Header()]


class V1ServerKey:
    """The v1 check; ``expected=None`` leaves the routes open (``/platform/health`` is 404)."""

    def __init__(self, expected: str | None) -> None:
        self.expected = expected

    def verify(self, authorization: str | None) -> None:
        """401 unless the request carries the configured key."""
        if not is_authorized(authorization, self.expected):
            raise HTTPException(status_code=401, detail=INVALID_KEY_DETAIL)

    async def __call__(self, authorization: AuthorizationHeader = None) -> None:
        self.verify(authorization)

    async def platform(self, authorization: AuthorizationHeader = None) -> None:
        """``/platform/health``: 404 without a configured key, 401 on a bad one."""
        if self.expected is None:
            raise HTTPException(status_code=404, detail="Not found")
        self.verify(authorization)


class _BearerAuth:
    """401 unless the request carries exactly ``Bearer <key>``; a plain ASGI middleware, so
    it adds no task per request (Starlette's ``BaseHTTPMiddleware`` runs the app in one)."""

    def __init__(self, app: ASGIApp, expected: bytes) -> None:
        self.app = app
        self.expected = expected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await JSONResponse({"detail": "unauthorized"}, status_code=401)(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)


def require_bearer(app: FastAPI, api_key: str) -> None:
    """The v2 check: every route, unknown paths and docs included, needs exactly
    ``Bearer <key>``; checked before anything else, body validation included (P§2.2)."""
    if not api_key.strip():
        raise ValueError("api_key must be non-empty when provided")
    app.add_middleware(_BearerAuth, expected=f"Bearer {api_key}".encode())


__all__ = ["INVALID_KEY_DETAIL", "AuthorizationHeader", "V1ServerKey", "require_bearer"]
