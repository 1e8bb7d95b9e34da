"""What a request may ask of the fleet: how big it may be, and which trainer URLs it may make
the workers call.

Admission carries a URL the workers will call (v1 ``server_url``, also the callback's base;
v2 ``chat_completions_url``). Without a check, anyone allowed to admit rollouts can make the
workers send requests to any host their network reaches (SSRF). With
``ROLLOUT_FLEET_ALLOWED_TRAINER_URLS`` set, the URL must lie under one of the listed
prefixes: same scheme, host and port, and a path at or below the prefix's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollout_sdk.server.http import ErrorDetail

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_and_path(url: httpx.URL) -> tuple[str, str, int | None, str]:
    port = url.port or _DEFAULT_PORTS.get(url.scheme)
    return url.scheme, url.host.lower(), port, url.path.rstrip("/")


def is_under(url: str, prefix: str) -> bool:
    try:
        scheme, host, port, path = _origin_and_path(httpx.URL(url))
    except (httpx.InvalidURL, ValueError):
        return False
    allowed_scheme, allowed_host, allowed_port, allowed_path = _origin_and_path(httpx.URL(prefix))
    return (
        (scheme, host, port) == (allowed_scheme, allowed_host, allowed_port)
        and (path == allowed_path or path.startswith(f"{allowed_path}/"))
        and ".." not in path.split("/")
    )


def check_trainer_url(field: str, url: str, allowed: Sequence[str]) -> None:
    """A 422 (shaped as FastAPI's validation errors) unless ``url`` lies under an allowed
    prefix; with no list configured, any URL passes."""
    if allowed and not any(is_under(url, prefix) for prefix in allowed):
        message = (
            f"{field} {url!r} is not an allowed trainer URL; this fleet calls only URLs under "
            f"{', '.join(allowed)} (ROLLOUT_FLEET_ALLOWED_TRAINER_URLS)"
        )
        error = {"type": "value_error", "loc": ("body", field), "msg": message, "input": url}
        raise RequestValidationError([error])


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorDetail, "description": "The body is not JSON."},
    413: {"model": ErrorDetail, "description": "The body is larger than the fleet accepts."},
    503: {"model": ErrorDetail, "description": "Redis does not answer; retry later."},
}


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(
            status_code=413,
            detail=f"request body larger than {limit} bytes (ROLLOUT_FLEET_MAX_REQUEST_BYTES)",
        )


class BodySizeLimit:
    """413 for a body over ``limit`` bytes: at once when its Content-Length says so, else as
    soon as the bytes read pass it (chunked uploads), before anything is parsed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            error = BodyTooLarge(self.limit)
            response = JSONResponse({"detail": error.detail}, status_code=error.status_code)
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise BodyTooLarge(self.limit)  # FastAPI answers it while reading the body
            return message

        await self.app(scope, limited, send)


__all__ = ["ERROR_RESPONSES", "BodySizeLimit", "check_trainer_url", "is_under"]
