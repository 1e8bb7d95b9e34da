"""Rollout servers: v1 :func:`create_app` / :func:`serve_agent_loop`, v2
:func:`create_rollout_server`.

FastAPI and uvicorn are optional (``rollout-sdk[server]``): the servers import them only when
first used. Without FastAPI the server functions still import, and calling one raises
``ImportError("FastAPI is required for create_app(). ...")`` as upstream's do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rollout_sdk import _compat
from rollout_sdk.server.api_key import API_KEY_PREFIX, generate_api_key, validate_api_key
from rollout_sdk.server.serve import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ServeError,
    serve_agent_loop,
    validate_and_report,
)
from rollout_sdk.server.state import AppState
from rollout_sdk.types.protocol import (
    DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    DEFAULT_RESULT_RETENTION_SEC,
    DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    POLLING_LEASE_HEADER,
)

if TYPE_CHECKING:
    from rollout_sdk.server.app import create_app
    from rollout_sdk.server.rollout_server import create_rollout_server

_NEEDS_FASTAPI = {
    "create_app": "rollout_sdk.server.app",
    "create_rollout_server": "rollout_sdk.server.rollout_server",
}


def __getattr__(name: str) -> Any:
    module = _NEEDS_FASTAPI.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError:
        if _compat.FASTAPI_AVAILABLE:
            raise  # not the missing extra: a real error
        value = _compat.needs_server_extra(name)
    globals()[name] = value  # resolved once
    return value


__all__ = [
    "API_KEY_PREFIX",
    "DEFAULT_HOST",
    "DEFAULT_POLLING_LEASE_TIMEOUT_SEC",
    "DEFAULT_PORT",
    "DEFAULT_RESULT_RETENTION_SEC",
    "DEFAULT_RESULT_WAIT_TIMEOUT_SEC",
    "POLLING_LEASE_HEADER",
    "AppState",
    "ServeError",
    "create_app",
    "create_rollout_server",
    "generate_api_key",
    "serve_agent_loop",
    "validate_and_report",
    "validate_api_key",
]
