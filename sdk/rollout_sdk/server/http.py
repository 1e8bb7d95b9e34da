"""FastAPI pieces shared by every server (in-process apps and the fleet gateway)."""

from __future__ import annotations

import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from rollout_sdk.server.heap import settle_heap


class ErrorDetail(BaseModel):
    """The body of every error that is not a body-validation error."""

    detail: str


class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrors(BaseModel):
    """FastAPI's body-validation 422, for routes whose 422 may also be an ``ErrorDetail``."""

    detail: list[ValidationIssue]


def _json_safe(value: Any) -> Any:
    """Non-finite floats (a NaN the client sent) become text; JSON cannot carry them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


_SECRET_FIELDS = frozenset({"api_key", "llm_api_key"})
# "scheme://user:password@" (up to the last "@" before the path): the part a URL's echo drops.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?//[^/?#]*@")
# A string input longer than this is not echoed (a 3 MB rollout id came back whole): the
# message says what is wrong with it.
ECHO_LIMIT = 1024


def _is_url_field(field: str) -> bool:
    """``server_url``, ``tool_server_url``, ``chat_completions_url``: any field named for a URL,
    which may carry a user and password."""
    return field.lower().endswith("url")


def _without_credentials(url: Any) -> Any:
    """A URL's echo without the user and password it may carry (a URL too broken to parse
    still has them)."""
    if not isinstance(url, str):
        return url
    return _USERINFO.sub(lambda m: f"{m.group(1) or ''}//***@", url)


def _shown(field: str, value: Any) -> Any:
    """``value`` of ``field`` as a 422 may echo it: keys redacted, URLs without credentials,
    at any depth (a missing field's error shows the whole body)."""
    if field in _SECRET_FIELDS:
        return "<redacted>"
    if isinstance(value, dict):
        return {key: _shown(str(key), item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shown(field, item) for item in value]
    return _without_credentials(value) if _is_url_field(field) else value


def _without_secrets(error: dict[str, Any]) -> dict[str, Any]:
    """A 422 names a bad key's field, never echoes a key or a URL's credentials (the input it
    shows may be the whole body), nor a long string."""
    long_text = isinstance(error.get("input"), str) and len(error["input"]) > ECHO_LIMIT
    loc = [str(part) for part in error.get("loc", ())]
    if long_text or _SECRET_FIELDS.intersection(loc):
        return {name: value for name, value in error.items() if name not in ("input", "ctx")}
    if "input" not in error:
        return error
    return {**error, "input": _shown(loc[-1] if loc else "", error["input"])}


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _json_safe(jsonable_encoder([_without_secrets(e) for e in exc.errors()]))
    return JSONResponse(status_code=422, content={"detail": errors})


def install_error_handlers(app: FastAPI) -> None:
    """422s that can always be encoded: FastAPI's own handler echoes the bad input and fails
    with a 500 when that input is a NaN."""
    app.add_exception_handler(RequestValidationError, _validation_error)


__all__ = [
    "ErrorDetail",
    "ValidationErrors",
    "install_error_handlers",
    "settle_heap",
]
