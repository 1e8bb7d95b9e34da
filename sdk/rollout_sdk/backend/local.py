"""``LocalBackend``: runs workflows and graders in this process (SDK.md §2.8)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import AsyncIterator
from typing import Any

from rollout_sdk.agent_workflow import AgentWorkflow
from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.backend.execution import WorkflowBundle, execute_rollout
from rollout_sdk.context import RolloutContext, get_rollout_context
from rollout_sdk.grader import Grader
from rollout_sdk.types.config import AgentWorkflowConfig, GraderConfig
from rollout_sdk.types.sample import ExecutionOutcome, ExecutionRequest

DEFAULT_MAX_CONCURRENT = 4  # the reference's limit when no workflow config is given


def resolve_object(value: Any) -> Any:
    """``"package.module:attr"`` → that object; anything else is returned as is."""
    if not isinstance(value, str):
        return value
    module_name, sep, attr = value.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"import string {value!r} must look like 'package.module:attr'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from exc


class LocalBackend(ExecutionBackend):
    def __init__(
        self,
        *,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader] | str | None = None,
        grader_config: GraderConfig | str | None = None,
    ) -> None:
        self.bundle = WorkflowBundle(
            workflow_cls=resolve_object(workflow),
            workflow_config=resolve_object(workflow_config) if workflow_config else None,
            grader_cls=resolve_object(grader) if grader else None,
            grader_config=resolve_object(grader_config) if grader_config else None,
        )
        self.max_concurrent = (
            self.bundle.max_concurrent if self.bundle.workflow_config else DEFAULT_MAX_CONCURRENT
        )
        self._slots = asyncio.Semaphore(self.max_concurrent) if self.max_concurrent else None
        self._queued = 0
        self._running = 0

    @property
    def workflow_cls(self) -> type[AgentWorkflow[Any]]:
        return self.bundle.workflow_cls

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "concurrency": {
                "max_concurrent": self.max_concurrent,
                "queued": self._queued,
                "running": self._running,
            },
        }

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        self._queued += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
        finally:
            self._queued -= 1
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            if self._slots is not None:
                self._slots.release()

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        ctx = get_rollout_context() or RolloutContext(rollout_id=request.id)
        enqueued = time.monotonic()
        async with self._slot():
            # The trainer's clock started at admission: time queued here is budget spent.
            queued_sec = time.monotonic() - enqueued
            return await execute_rollout(self.bundle, request, ctx, queued_sec=queued_sec)


__all__ = ["DEFAULT_MAX_CONCURRENT", "LocalBackend", "resolve_object"]
