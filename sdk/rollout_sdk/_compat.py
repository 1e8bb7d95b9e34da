"""Optional dependencies (``osmosis_ai.rollout._compat``): import one if it is installed, or
fail with the extra that provides it.

``fastapi``, ``uvicorn`` and ``pydantic_settings`` (the module, or ``None``) and their
``*_AVAILABLE`` flags are looked up on first use, not when this module is imported, so the
SDK never imports FastAPI before a server is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn

PACKAGE = "rollout-sdk"
# Set on first use by __getattr__ below.
fastapi: ModuleType | None
uvicorn: ModuleType | None
pydantic_settings: ModuleType | None
FASTAPI_AVAILABLE: bool
UVICORN_AVAILABLE: bool
PYDANTIC_SETTINGS_AVAILABLE: bool
_FLAGS = {
    "FASTAPI_AVAILABLE": "fastapi",
    "UVICORN_AVAILABLE": "uvicorn",
    "PYDANTIC_SETTINGS_AVAILABLE": "pydantic_settings",
}


def import_optional(
    module_name: str, package_name: str | None = None
) -> tuple[ModuleType | None, bool]:
    """``(module, True)`` when ``module_name`` imports, else ``(None, False)``.

    ``package_name`` (the distribution's name) is accepted for upstream compatibility.
    """
    try:
        return importlib.import_module(module_name), True
    except ImportError:
        return None, False


def require_optional(
    module_name: str,
    package_name: str | None = None,
    feature_name: str = "",
    install_extra: str | None = None,
) -> ModuleType:
    """The module, or ``ImportError`` saying which feature needs which package and extra."""
    module, available = import_optional(module_name)
    if module is None or not available:
        package = package_name or module_name
        raise ImportError(
            f"{feature_name or module_name} requires '{package}'. "
            f"Install it with: pip install '{PACKAGE}[{install_extra or package}]'"
        )
    return module


def missing_server_extra(dependency: str, function: str) -> ImportError:
    """The error for a server function called without the ``server`` extra; the message
    starts as upstream's does (``FastAPI is required for create_app().``)."""
    return ImportError(
        f"{dependency} is required for {function}(). "
        f"Install it with: pip install '{PACKAGE}[server]'"
    )


def needs_server_extra(function: str) -> Callable[..., NoReturn]:
    """A stand-in for a FastAPI-backed function when FastAPI is not installed: importing it
    works (as upstream's does); calling it raises :func:`missing_server_extra`'s error."""

    def unavailable(*args: Any, **kwargs: Any) -> NoReturn:
        raise missing_server_extra("FastAPI", function)

    unavailable.__name__ = unavailable.__qualname__ = function
    return unavailable


def __getattr__(name: str) -> Any:
    for flag, module_name in _FLAGS.items():
        if name in (flag, module_name):
            module, available = import_optional(module_name)
            globals().update({module_name: module, flag: available})  # looked up once
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FASTAPI_AVAILABLE",
    "PYDANTIC_SETTINGS_AVAILABLE",
    "UVICORN_AVAILABLE",
    "fastapi",
    "import_optional",
    "missing_server_extra",
    "needs_server_extra",
    "pydantic_settings",
    "require_optional",
    "uvicorn",
]
