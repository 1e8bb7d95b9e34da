"""``import osmosis_ai...`` for agent modules written against the upstream SDK (SDK.md "Naming").

A meta-path finder maps ``osmosis_ai`` and ``osmosis_ai.rollout`` to ``rollout_sdk`` and
``osmosis_ai[.rollout].X`` to ``rollout_sdk.X`` (plus the few upstream paths whose home has
another name here, :data:`RENAMED`). The alias resolves to the *same* module objects, so a
user's ``RolloutAgentLoop`` subclass is ours and ``isinstance`` checks hold.

``ROLLOUT_SDK_OSMOSIS_ALIAS`` chooses what ``osmosis_ai`` means in a process that loads
agents (the fleet's worker and gateway, the ``rollout-sdk`` CLI):

* ``ours`` (default): the alias, even when the real ``osmosis-ai`` is installed beside us
  (agents declare it as a dependency, and only our classes run on the fleet). Setting the
  installed package aside logs one notice line that says so and how to choose upstream.
* ``upstream``: no alias; ``osmosis_ai`` is the installed package (or missing).
* ``off``: no alias.

``1``/``0`` are accepted for ``ours``/``off``.
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

ALIAS_ENV = "ROLLOUT_SDK_OSMOSIS_ALIAS"
UPSTREAM_VERSION = "0.3.8"
"""The upstream release whose public API the alias provides; it is ``osmosis_ai.__version__``
(and so ``rollout_sdk.__version__``, the same module). Our distribution's own version is
``importlib.metadata.version("rollout-sdk")``."""
UPSTREAM = "osmosis_ai"
UPSTREAM_DISTRIBUTION = "osmosis-ai"
TARGET = "rollout_sdk"
_NAMESPACES = (f"{UPSTREAM}.rollout", UPSTREAM)
RENAMED = {
    # Upstream keeps its rubric judge under ``eval``; ours is ``rollout_sdk.rubric`` (our
    # ``evaluation`` package is the eval command). ``osmosis_ai.eval`` itself exports nothing.
    f"{UPSTREAM}.eval.rubric": f"{TARGET}.rubric",
    f"{UPSTREAM}.eval": f"{TARGET}.rubric",
}
"""Upstream module prefixes whose ``rollout_sdk`` home has a different name (longest first)."""

logger = logging.getLogger(__name__)


class AliasMode(enum.StrEnum):
    """What ``import osmosis_ai`` resolves to in a process that loads agents."""

    OURS = "ours"
    UPSTREAM = "upstream"
    OFF = "off"


_SPELLINGS = {"1": AliasMode.OURS, "0": AliasMode.OFF, **{m.value: m for m in AliasMode}}


class AliasSettingError(ValueError):
    """``ROLLOUT_SDK_OSMOSIS_ALIAS`` holds a value that is not one of the modes."""


def alias_mode() -> AliasMode:
    """The mode ``ROLLOUT_SDK_OSMOSIS_ALIAS`` chooses (``ours`` when unset or empty)."""
    raw = os.environ.get(ALIAS_ENV, "").strip().lower()
    if not raw:
        return AliasMode.OURS
    mode = _SPELLINGS.get(raw)
    if mode is None:
        raise AliasSettingError(
            f"{ALIAS_ENV}={raw!r} is not a choice: set it to ours (the default: osmosis_ai "
            "imports give rollout_sdk), upstream (the installed osmosis-ai package) or off"
        )
    return mode


def alias_target(fullname: str) -> str | None:
    """The ``rollout_sdk`` module an upstream module name stands for, or ``None``."""
    for prefix, home in RENAMED.items():
        if fullname == prefix or fullname.startswith(prefix + "."):
            return home + fullname[len(prefix) :]
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


def _installed_upstream() -> str | None:
    """The installed ``osmosis-ai``'s version ("unknown" without metadata), or ``None``."""
    if UPSTREAM not in sys.modules and importlib.util.find_spec(UPSTREAM) is None:
        return None
    try:
        return importlib.metadata.version(UPSTREAM_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _forget_upstream_modules() -> None:
    for name in [n for n in sys.modules if n == UPSTREAM or n.startswith(UPSTREAM + ".")]:
        del sys.modules[name]


def alias_active() -> bool:
    """Whether ``osmosis_ai`` imports currently resolve to ``rollout_sdk``."""
    return any(isinstance(finder, _AliasFinder) for finder in sys.meta_path)


def install_osmosis_alias() -> bool:
    """Install the alias if the mode is ``ours``; True when it is active.

    Raises :class:`AliasSettingError` for a value of ``ROLLOUT_SDK_OSMOSIS_ALIAS`` that is
    not a mode.
    """
    if alias_active():
        return True
    if alias_mode() is not AliasMode.OURS:
        return False
    version = _installed_upstream()
    if version is not None:
        # Modules of the real package imported before now would shadow the alias.
        _forget_upstream_modules()
        logger.warning(
            "rollout-sdk: osmosis_ai imports resolve to rollout_sdk, not to the installed "
            "osmosis-ai %s; set %s=upstream to use that package instead",
            version,
            ALIAS_ENV,
        )
    # First on the path: the normal finders would otherwise load our files a second time
    # under the upstream names (making duplicate classes), or load the real package.
    sys.meta_path.insert(0, _AliasFinder())
    return True


def uninstall_osmosis_alias() -> None:
    """Remove the alias and forget every ``osmosis_ai`` module name (tests use this)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AliasFinder)]
    _forget_upstream_modules()


__all__ = [
    "ALIAS_ENV",
    "RENAMED",
    "UPSTREAM_VERSION",
    "AliasMode",
    "AliasSettingError",
    "alias_active",
    "alias_mode",
    "alias_target",
    "install_osmosis_alias",
    "uninstall_osmosis_alias",
]
