"""Loading a user's agent from a ``module:attr`` or ``path/to/file.py:attr`` reference."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType

from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.backend.execution import WorkflowBundle
from rollout_sdk.backend.local import LocalBackend
from rollout_sdk.compat import ALIAS_ENV, UPSTREAM, AliasSettingError, install_osmosis_alias
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.discovery import DiscoveryError, bundle_for, discover_workflow

# A v1 agent loop; a v2 workflow (run in the worker's process); or a backend that runs each
# rollout its own way (HarborBackend: in a sandbox), which the worker calls as is.
Agent = RolloutAgentLoop | WorkflowBundle | ExecutionBackend
"""A loaded agent: a v1 agent loop, or a v2 workflow with its grader and configs."""


class AgentLoadError(Exception):
    """The agent reference cannot be turned into an agent."""


def split_reference(reference: str) -> tuple[str, str | None]:
    """``"pkg.mod:attr"`` → ``("pkg.mod", "attr")``; split on the last colon."""
    module, sep, attr = reference.rpartition(":")
    if not sep:
        return reference, None
    if not module or not attr:
        raise AgentLoadError(f"invalid agent reference {reference!r}: expected module:attribute")
    return module, attr


def _looks_like_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise AgentLoadError(f"agent file {str(path)!r} does not exist")
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # so the agent's sibling modules import
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AgentLoadError(f"cannot import {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_agent_module(target: str) -> ModuleType:
    """Import a module by dotted name (the working directory is importable) or by file path."""
    try:
        aliased = install_osmosis_alias()
    except AliasSettingError as exc:
        raise AgentLoadError(str(exc)) from exc
    try:
        if _looks_like_path(target):
            return _import_file(Path(target).resolve())
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        return importlib.import_module(target)
    except AgentLoadError:
        raise
    except PermissionError as exc:
        # In the fleet's images this process is uid 10001 and the agent a folder mounted
        # from the host: it must be readable by others there.
        where = Path(exc.filename).parent if exc.filename else "the agent's folder"
        raise AgentLoadError(
            f"cannot import {target!r}: {exc}. This process runs as uid {os.getuid()}: make "
            f"{where} and its files readable by it (a folder mounted into a container: on the "
            "host, chmod -R a+rX <folder>)"
        ) from exc
    except ModuleNotFoundError as exc:
        if not aliased and (exc.name or "").split(".")[0] == UPSTREAM:
            raise AgentLoadError(
                f"cannot import {target!r}: {exc}; {ALIAS_ENV} chooses the installed "
                "osmosis-ai package and it has no such module: install it, or unset "
                f"{ALIAS_ENV} to run the agent on rollout_sdk"
            ) from exc
        raise AgentLoadError(f"cannot import {target!r}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise AgentLoadError(f"cannot import {target!r}: {type(exc).__name__}: {exc}") from exc


def _public_names(module: ModuleType) -> list[str]:
    return sorted(name for name in vars(module) if not name.startswith("_"))


def _as_agent_loop(obj: object, reference: str) -> RolloutAgentLoop:
    if inspect.isclass(obj) and issubclass(obj, RolloutAgentLoop):
        try:
            obj = obj()
        except Exception as exc:
            raise AgentLoadError(
                f"cannot construct {reference}: {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(obj, RolloutAgentLoop):
        raise AgentLoadError(
            f"{reference} is a {type(obj).__name__}, not a RolloutAgentLoop instance or subclass"
        )
    return obj


def _discover_agent_loop(module: ModuleType, reference: str) -> RolloutAgentLoop:
    found = {id(v): v for v in vars(module).values() if isinstance(v, RolloutAgentLoop)}
    if len(found) != 1:
        raise AgentLoadError(
            f"{reference}: expected module:attribute (found {len(found)} agent loop instances "
            "to pick from)"
        )
    return next(iter(found.values()))


def _v1_instances(module: ModuleType) -> list[RolloutAgentLoop]:
    return list(
        {id(v): v for v in vars(module).values() if isinstance(v, RolloutAgentLoop)}.values()
    )


def own_backend(module: ModuleType, entrypoint: str) -> ExecutionBackend | None:
    """A backend that runs rollouts its own way (not a LocalBackend): one at module level or
    behind a module-level app, or the one ``main()`` builds when the module imports such a
    backend class and defines ``main`` (upstream's Harbor rollout folders)."""
    for value in vars(module).values():
        served = getattr(getattr(value, "state", None), "backend", None)
        for candidate in (value, served):
            if isinstance(candidate, ExecutionBackend) and not isinstance(candidate, LocalBackend):
                return candidate
    main = getattr(module, "main", None)
    builds_one = any(
        inspect.isclass(v) and issubclass(v, ExecutionBackend) and v is not LocalBackend
        and v is not ExecutionBackend
        for v in vars(module).values()
    )  # fmt: skip
    if callable(main) and builds_one:
        from rollout_sdk.server.capture import NoBackendError, backend_from_main

        try:
            return backend_from_main(main, entrypoint)
        except NoBackendError as exc:
            raise AgentLoadError(str(exc)) from None
    return None


def load_agent(reference: str) -> Agent:
    """Resolve a reference to either generation's agent.

    ``file.py:attr`` / ``module:attr`` names the agent loop, workflow class, LocalBackend or
    rollout-server app; without ``:attr`` the module must hold one agent loop instance, or
    else define its v2 agent per the discovery rules.
    """
    target, attr = split_reference(reference)
    module = import_agent_module(target)
    try:
        if attr is None:
            loops = _v1_instances(module)
            if len(loops) == 1:
                return loops[0]
            backend = own_backend(module, target)
            return backend if backend is not None else discover_workflow(module, target)
        if not hasattr(module, attr):
            raise AgentLoadError(
                f"{target!r} has no attribute {attr!r}; available: "
                f"{', '.join(_public_names(module))}"
            )
        value = getattr(module, attr)
        if isinstance(value, ExecutionBackend) and not isinstance(value, LocalBackend):
            return value
        served = getattr(getattr(value, "state", None), "backend", None)
        if isinstance(served, ExecutionBackend) and not isinstance(served, LocalBackend):
            return served
        bundle = bundle_for(value, module, target)
        return bundle if bundle is not None else _as_agent_loop(value, reference)
    except DiscoveryError as exc:
        raise AgentLoadError(str(exc)) from exc


def load_agent_loop(reference: str) -> RolloutAgentLoop:
    """Resolve ``module:attr`` (or ``file.py:attr``) to a v1 agent loop instance.

    Without ``:attr`` the module must hold exactly one agent loop instance.
    """
    target, attr = split_reference(reference)
    module = import_agent_module(target)
    if attr is None:
        return _discover_agent_loop(module, reference)
    if not hasattr(module, attr):
        raise AgentLoadError(
            f"{target!r} has no attribute {attr!r}; available: {', '.join(_public_names(module))}"
        )
    return _as_agent_loop(getattr(module, attr), reference)


__all__ = [
    "Agent",
    "AgentLoadError",
    "import_agent_module",
    "load_agent",
    "load_agent_loop",
    "split_reference",
]
