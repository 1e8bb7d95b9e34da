"""What a request may ask of the fleet: how big it may be, and which trainer URLs it may make
the workers call.

Admission carries a URL the workers will call (v1 ``server_url``, also the callback's base;
v2 ``chat_completions_url``). Without a check, anyone allowed to admit rollouts can make the
workers send requests to any host their network reaches (SSRF). With
``ROLLOUT_FLEET_ALLOWED_TRAINER_URLS`` set, the URL must lie under one of the listed
prefixes: same scheme, host and port, and a path at or below the prefix's path. Whatever the
list says, a trainer URL is refused if it carries credentials (``user:password@``: they would
be stored with the request and shown in errors), a query or fragment (the fleet appends paths
to it: ``?x=`` would turn them into a parameter and aim the worker at any path of the host),
or names a link-local or cloud-metadata address (where instance credentials are served) in
any form a resolver reads, or an address in ``OSMOSIS_ROLLOUT_CLIENT_REFUSED_NETWORKS``: the
SDK's destination policy, which the workers' clients check again on every address they
connect to (a name is only checked there, as it resolves).
"""

from __future__ import annotations

import ipaddress
import re
import signal
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollout_sdk.client.destinations import refused_host
from rollout_sdk.config import get_settings
from rollout_sdk.server.http import ErrorDetail

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_and_path(url: httpx.URL) -> tuple[str, str, int | None, str]:
    port = url.port or _DEFAULT_PORTS.get(url.scheme)
    return url.scheme, url.host.lower(), port, url.path.rstrip("/")


# A dot, slash or backslash still percent-encoded once httpx decoded the path: a server that
# decodes again (or a proxy before it) sees a segment the allow-list did not.
_ENCODED_AGAIN = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


def _leaves_its_prefix(path: str) -> bool:
    """Whether a server could read ``path`` (decoded once) as outside where it appears to be:
    a ``.``/``..`` segment, also behind a path parameter (``..;/``, read as ``..`` by
    servlet containers), a backslash, or an encoding left after decoding."""
    for segment in path.split("/"):
        if segment.split(";", 1)[0] in (".", "..") or "\\" in segment:
            return True
    return bool(_ENCODED_AGAIN.search(path))


def is_under(url: str, prefix: str) -> bool:
    """Whether ``url`` is ``prefix`` or below it, however the server at it reads the path."""
    try:
        scheme, host, port, path = _origin_and_path(httpx.URL(url))
    except (httpx.InvalidURL, ValueError):
        return False
    allowed_scheme, allowed_host, allowed_port, allowed_path = _origin_and_path(httpx.URL(prefix))
    return (
        (scheme, host, port) == (allowed_scheme, allowed_host, allowed_port)
        and (path == allowed_path or path.startswith(f"{allowed_path}/"))
        and not _leaves_its_prefix(path)
    )


def _has_credentials(url: str) -> bool:
    try:
        return bool(httpx.URL(url).userinfo)
    except (httpx.InvalidURL, ValueError):
        return "@" in url.partition("://")[2].partition("/")[0]


def never_called(url: str) -> str | None:
    """Why the fleet never calls ``url``, whatever the allow-list says; None if it may."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return "is not a URL"
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        return "carries a query or fragment (the fleet appends paths to a trainer URL)"
    return refused_host(parsed.host, get_settings().client.refused_networks)


def check_trainer_url(field: str, url: str, allowed: Sequence[str]) -> None:
    """A 422 (shaped as FastAPI's validation errors) unless ``url`` may be called: never a
    query, fragment, link-local or metadata address; and with an allow-list configured, only
    under one of its prefixes."""
    if _has_credentials(url):  # named, never echoed: the 422 would show the password
        message = (
            f"{field} must not carry credentials (user:password@host): they would be stored "
            "with the request and shown in errors; send the trainer's key as its API key field"
        )
        error = {"type": "value_error", "loc": ("body", field), "msg": message}
        raise RequestValidationError([error])
    refused = never_called(url)
    if refused is not None:
        message = f"{field} {url!r} {refused}"
    elif allowed and not any(is_under(url, prefix) for prefix in allowed):
        message = (
            f"{field} {url!r} is not an allowed trainer URL; this fleet calls only URLs under "
            f"{', '.join(allowed)} (ROLLOUT_FLEET_ALLOWED_TRAINER_URLS)"
        )
    else:
        return
    error = {"type": "value_error", "loc": ("body", field), "msg": message, "input": url}
    raise RequestValidationError([error])


# Deeper JSON than workers read back: pydantic's JSON parser (which reads a stored request)
# stops at a depth of about 200, and its serializer (which stores it) a little deeper.
MAX_NESTING = 64


def nesting(value: object) -> int:
    """How deep ``value`` nests containers (a model's fields, dicts, lists), walked without
    recursion so that no depth can overflow the stack."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, BaseModel):
            children: Iterable[object] = vars(item).values()
        elif isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_nesting(request: BaseModel) -> None:
    """A 422 naming the field for a request nested deeper than :data:`MAX_NESTING` levels,
    before anything is written: a worker could not read it back."""
    for name, value in vars(request).items():
        if nesting(value) > MAX_NESTING - 1:
            message = (
                f"{name} nests more than {MAX_NESTING} levels of objects and arrays; the fleet "
                "stores a request as JSON that workers read back, and accepts no deeper"
            )
            error = {"type": "value_error", "loc": ("body", name), "msg": message}
            raise RequestValidationError([error])


def open_bind_refusal(host: str, has_key: bool, insecure_open: bool) -> str | None:
    """Why a gateway must not listen on ``host``: without a server key, only a loopback
    address, unless the operator said, by name, to run it open."""
    if has_key or insecure_open:
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    return (
        f"refusing to listen on {host} without a server key: anyone who reaches the port "
        "could admit, cancel and drain rollouts. Set ROLLOUT_FLEET_API_KEY (trainers send it "
        "as 'Authorization: Bearer <key>'), bind 127.0.0.1, or, on a network where every "
        "client is trusted, set ROLLOUT_FLEET_INSECURE_OPEN_GATEWAY=true."
    )


def served_host() -> str | None:
    """The address the ASGI server running this process listens on, when it says: uvicorn
    (alone, or each of ``--workers``) keeps its config on the signal handler it installs
    before it starts the app. A Unix socket counts as loopback; None: not known (another
    server, or an inherited file descriptor)."""
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    config = getattr(server, "config", None)
    if config is None or getattr(config, "fd", None) is not None:
        return None
    if getattr(config, "uds", None):
        return "localhost"
    host = getattr(config, "host", None)
    return host if isinstance(host, str) else None


class OpenBindRefusal:
    """The gateway app refuses to serve without a server key on a non-loopback address,
    however it is started (``rollout-fleet gateway`` checks first, with the same function).
    Where the server's address is known its startup fails, in one line and no traceback;
    where it is not, a request that arrived on a non-loopback address gets 503 and the same
    line, instead of an answer."""

    def __init__(self, app: ASGIApp, has_key: bool, insecure_open: bool) -> None:
        self.app = app
        self._has_key = has_key
        self._insecure_open = insecure_open
        self._host: str | None = None

    def _refusal(self, host: str) -> str | None:
        return open_bind_refusal(host, self._has_key, self._insecure_open)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._has_key or self._insecure_open:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "lifespan":
            self._host = served_host()
            refusal = self._refusal(self._host) if self._host is not None else None
            if refusal is not None:
                await receive()  # lifespan.startup: the server logs the message and exits
                await send({"type": "lifespan.startup.failed", "message": refusal})
                return
        elif scope["type"] == "http" and self._host is None:
            server = scope.get("server")
            refusal = self._refusal(server[0]) if server and server[1] is not None else None
            if refusal is not None:
                await JSONResponse({"detail": refusal}, status_code=503)(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


__all__ = [
    "ERROR_RESPONSES",
    "MAX_NESTING",
    "BodySizeLimit",
    "OpenBindRefusal",
    "check_nesting",
    "check_trainer_url",
    "is_under",
    "open_bind_refusal",
]
