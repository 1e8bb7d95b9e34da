"""Execution backends: where v2 rollouts run."""

from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.backend.execution import WorkflowBundle, execute_rollout
from rollout_sdk.backend.local import LocalBackend

__all__ = ["ExecutionBackend", "LocalBackend", "WorkflowBundle", "execute_rollout"]
