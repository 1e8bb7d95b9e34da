"""Finding the v2 agent in an entry-point module (SDK.md §2.7).

A module either defines exactly one concrete ``AgentWorkflow`` subclass (plus at most one
workflow config, one grader, one grader config at module level), or, 0.3 style, builds a
``LocalBackend`` (possibly inside a ``create_rollout_server`` app) whose parts are used as is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from rollout_sdk.agent_workflow import AgentWorkflow
from rollout_sdk.backend.execution import WorkflowBundle
from rollout_sdk.backend.local import LocalBackend
from rollout_sdk.grader import Grader
from rollout_sdk.types.config import AgentWorkflowConfig, GraderConfig


class DiscoveryError(Exception):
    """The entry point does not define exactly one agent."""


def _bindings(module: ModuleType, matches: Callable[[Any], bool]) -> dict[int, tuple[Any, str]]:
    """Matching module-level objects by identity, each with its smallest binding name."""
    found: dict[int, tuple[Any, str]] = {}
    for name, value in sorted(vars(module).items()):
        if matches(value) and id(value) not in found:
            found[id(value)] = (value, name)
    return found


def _concrete_subclass(base: type) -> Callable[[Any], bool]:
    return lambda v: (
        inspect.isclass(v) and issubclass(v, base) and v is not base and not inspect.isabstract(v)
    )


def _at_most_one(
    module: ModuleType, matches: Callable[[Any], bool], what: str, entrypoint: str
) -> Any:
    found = _bindings(module, matches)
    if len(found) > 1:
        names = sorted(name for _, name in found.values())
        raise DiscoveryError(
            f"Multiple {what} found in '{entrypoint}': {names}. Keep only one at module level."
        )
    return next(iter(found.values()))[0] if found else None


def module_backend(module: ModuleType) -> LocalBackend | None:
    """A module-level LocalBackend, or the backend of a module-level rollout server app."""
    for value in vars(module).values():
        if isinstance(value, LocalBackend):
            return value
        backend = getattr(getattr(value, "state", None), "backend", None)
        if isinstance(backend, LocalBackend):
            return backend
    return None


def discover_workflow(module: ModuleType, entrypoint: str) -> WorkflowBundle:
    backend = module_backend(module)
    if backend is not None:
        return backend.bundle
    workflows = _bindings(module, _concrete_subclass(AgentWorkflow))
    if not workflows:
        raise DiscoveryError(f"No AgentWorkflow subclass found in '{entrypoint}'")
    if len(workflows) > 1:
        names = sorted(name for _, name in workflows.values())
        raise DiscoveryError(
            f"Multiple AgentWorkflow subclasses found in '{entrypoint}': {names}. "
            "Keep only one concrete AgentWorkflow subclass in the entry point."
        )
    return WorkflowBundle(
        workflow_cls=next(iter(workflows.values()))[0],
        workflow_config=_at_most_one(
            module, lambda v: isinstance(v, AgentWorkflowConfig),
            "AgentWorkflowConfig instances", entrypoint,
        ),
        grader_cls=_at_most_one(
            module, _concrete_subclass(Grader), "Grader subclasses", entrypoint
        ),
        grader_config=_at_most_one(
            module, lambda v: isinstance(v, GraderConfig), "GraderConfig instances", entrypoint
        ),
    )  # fmt: skip


def bundle_for(value: Any, module: ModuleType, entrypoint: str) -> WorkflowBundle | None:
    """The bundle an explicitly named object stands for (workflow class, backend or app)."""
    if isinstance(value, LocalBackend):
        return value.bundle
    backend = getattr(getattr(value, "state", None), "backend", None)
    if isinstance(backend, LocalBackend):
        return backend.bundle
    if _concrete_subclass(AgentWorkflow)(value):
        discovered = discover_workflow(module, entrypoint)
        if discovered.workflow_cls is value:
            return discovered
        return WorkflowBundle(workflow_cls=value)
    return None


__all__ = ["DiscoveryError", "bundle_for", "discover_workflow", "module_backend"]
