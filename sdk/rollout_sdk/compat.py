"""``import osmosis_ai...`` for agent modules written against the upstream SDK (SDK.md "Naming").

A meta-path finder maps ``osmosis_ai`` and ``osmosis_ai.rollout`` to ``rollout_sdk`` and
``osmosis_ai[.rollout].X`` to ``rollout_sdk.X``. The alias resolves to the *same* module
objects, so a user's ``RolloutAgentLoop`` subclass is ours and ``isinstance`` checks hold.
It is installed only when the real ``osmosis_ai`` package is absent, and
``ROLLOUT_SDK_OSMOSIS_ALIAS=0`` switches it off.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

ALIAS_ENV = "ROLLOUT_SDK_OSMOSIS_ALIAS"
UPSTREAM = "osmosis_ai"
TARGET = "rollout_sdk"
_NAMESPACES = (f"{UPSTREAM}.rollout", UPSTREAM)


def alias_target(fullname: str) -> str | None:
    """The ``rollout_sdk`` module an upstream module name stands for, or ``None``."""
    for namespace in _NAMESPACES:
        if fullname == namespace:
            return TARGET
        if fullname.startswith(namespace + "."):
            return TARGET + fullname[len(namespace) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self._target = target
        self._original_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._target)
        self._original_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec on the shared module; put ours back.
        module.__spec__ = self._original_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        module_name = alias_target(fullname)
        if module_name is None or importlib.util.find_spec(module_name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module_name))


def install_osmosis_alias() -> bool:
    """Install the alias unless disabled or the real package exists; True when active."""
    if any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        return True
    if os.environ.get(ALIAS_ENV, "1") == "0" or importlib.util.find_spec(UPSTREAM) is not None:
        return False
    # First on the path: the normal finders would otherwise load our files a second time
    # under the upstream names, making duplicate classes.
    sys.meta_path.insert(0, _AliasFinder())
    return True


def uninstall_osmosis_alias() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AliasFinder)]
    for name in [n for n in sys.modules if n == UPSTREAM or n.startswith(UPSTREAM + ".")]:
        del sys.modules[name]


__all__ = ["ALIAS_ENV", "alias_target", "install_osmosis_alias", "uninstall_osmosis_alias"]
