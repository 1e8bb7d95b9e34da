"""v1 rollout servers: :func:`create_app` (in-process) and :func:`serve_agent_loop`.

FastAPI and uvicorn are optional (``rollout-sdk[server]``); they are imported only when
:func:`create_app` is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollout_sdk.server.api_key import API_KEY_PREFIX, generate_api_key, validate_api_key
from rollout_sdk.server.serve import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ServeError,
    serve_agent_loop,
    validate_and_report,
)

if TYPE_CHECKING:
    from rollout_sdk.server.app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        try:
            from rollout_sdk.server.app import create_app
        except ImportError as exc:
            raise ImportError(
                "create_app needs FastAPI: pip install 'rollout-sdk[server]'"
            ) from exc
        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "API_KEY_PREFIX",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ServeError",
    "create_app",
    "generate_api_key",
    "serve_agent_loop",
    "validate_and_report",
    "validate_api_key",
]
