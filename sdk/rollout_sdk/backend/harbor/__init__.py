"""Harbor sandboxes: each rollout a Harbor trial in a container of its own.

Needs the ``harbor`` extra (``pip install 'rollout-sdk[harbor]'``, Python >= 3.12); the
names load on first use, so importing this package without it fails only when they are
asked for, with what to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout_sdk.backend.harbor.backend import HarborBackend, HarborBackendError
    from rollout_sdk.backend.harbor.tasks import TaskMode

_EXPORTS = {
    "HarborBackend": "rollout_sdk.backend.harbor.backend",
    "HarborBackendError": "rollout_sdk.backend.harbor.backend",
    "TaskMode": "rollout_sdk.backend.harbor.tasks",
}


class HarborMissingError(ImportError):
    """The harbor package is not installed."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name != "harbor" and not (exc.name or "").startswith("harbor."):
            raise
        raise HarborMissingError(
            "the Harbor backend needs the harbor package: install the harbor extra "
            "(pip install 'rollout-sdk[harbor]', or 'rollout-fleet[harbor]'; Python >= 3.12)"
        ) from None


__all__ = ["HarborBackend", "HarborBackendError", "TaskMode"]
