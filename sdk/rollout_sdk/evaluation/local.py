"""Running an evaluation's work items in this process (``rollout-sdk eval run``): each one
exactly as ``rollout-sdk test`` runs a row, against the item's model bridge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

from rollout_sdk.config import get_settings
from rollout_sdk.evaluation.run import Job
from rollout_sdk.loader import Agent
from rollout_sdk.localrun.runner import LocalRunner, RowResult, RunOptions


@dataclass
class LocalExecutor:
    agent: Agent
    options: RunOptions = field(default_factory=RunOptions)
    default_in_flight: int = 1
    where: str = "in this process"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def run(self, job: Job) -> RowResult:
        runner = LocalRunner(self.agent, job.bridge, self.options, get_settings())
        return await runner.run_row(job.row, job.rollout_id, job.metadata)


__all__ = ["LocalExecutor"]
