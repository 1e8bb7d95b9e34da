"""Lazy public names, listed once: in a package's ``__init__.pyi``.

The stub's ``from X import name as name`` lines are the package's export list. Type checkers
read it as the package's interface; :func:`attach` reads the same lines at run time and
imports each name from its home on first use, so ``import rollout_sdk`` stays cheap and never
imports FastAPI or an agent framework until a name that needs one is used.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _homes(package: str, stub: Path) -> dict[str, tuple[str, str]]:
    """Public name → (home module, name there), from the stub's ``from … import`` lines."""
    homes = {}
    for node in ast.parse(stub.read_text(), str(stub)).body:
        if isinstance(node, ast.ImportFrom):
            module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                homes[alias.asname or alias.name] = (module, alias.name)
    return homes


def attach(
    package: str, init_file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for the package whose ``__init__.py`` is
    ``init_file``, from the ``__init__.pyi`` beside it."""
    homes = _homes(package, Path(init_file).with_suffix(".pyi"))
    exported = sorted(homes)

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home[0]), home[1])
        vars(sys.modules[package])[name] = value  # resolved once
        return value

    def __dir__() -> list[str]:
        return list(exported)

    return __getattr__, __dir__, list(exported)


__all__ = ["attach"]
