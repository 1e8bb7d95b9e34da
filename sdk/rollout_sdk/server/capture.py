"""Taking the backend an entry point builds inside ``main()``.

Upstream's Harbor rollout folders build their backend and server in ``main()`` and serve it
with ``uvicorn.run`` when run as a script. A fleet worker imports the module instead and
needs that backend: :func:`backend_from_main` calls ``main()`` while
``create_rollout_server`` is told to hand its backend over rather than build an app, which
ends ``main()`` before it serves anything.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from rollout_sdk.backend.base import ExecutionBackend

_capturing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rollout_capturing_backend", default=False
)


class BackendCaptured(BaseException):
    """Raised by ``create_rollout_server`` while a backend is being taken."""

    def __init__(self, backend: ExecutionBackend, lifespan: Any) -> None:
        super().__init__("backend captured")
        self.backend = backend
        self.lifespan = lifespan


def capturing() -> bool:
    return _capturing.get()


class NoBackendError(RuntimeError):
    """``main()`` returned without calling ``create_rollout_server``."""


def backend_from_main(main: Callable[[], Any], entrypoint: str) -> ExecutionBackend:
    """The backend ``main()`` passes to ``create_rollout_server`` (``main`` stops there)."""
    token = _capturing.set(True)
    try:
        main()
    except BackendCaptured as captured:
        return captured.backend
    finally:
        _capturing.reset(token)
    raise NoBackendError(
        f"{entrypoint}: main() returned without calling create_rollout_server(backend=...)"
    )


__all__ = ["BackendCaptured", "NoBackendError", "backend_from_main", "capturing"]
