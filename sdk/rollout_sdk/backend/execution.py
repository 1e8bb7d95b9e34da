"""Running one v2 rollout: the workflow under its deadline, then the grader under its own.

Every v2 executor calls :func:`execute_rollout`: :class:`~rollout_sdk.backend.local.LocalBackend`
in-process and the fleet's workers, so deadlines, grading conditions and error categories
are the same wherever a rollout runs (PROTOCOL.md §2.6, §2.9, §2.10).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_sdk.agent_workflow import AgentWorkflow
from rollout_sdk.backend.artifacts import artifacts_dir
from rollout_sdk.backend.errors import categorize_exception
from rollout_sdk.client.capped import reading_answers
from rollout_sdk.config import get_settings
from rollout_sdk.context import AgentWorkflowContext, GraderContext, RolloutContext
from rollout_sdk.core.foreign import describe
from rollout_sdk.grader import Grader
from rollout_sdk.types.config import AgentWorkflowConfig, GraderConfig
from rollout_sdk.types.output import UnsupportedOutputError, coerce_output
from rollout_sdk.types.sample import (
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
)

logger = logging.getLogger(__name__)

UNGRADABLE_MESSAGE = (
    "grading was requested but the rollout cannot be graded: {reason} "
    "(send grade=false to skip grading)"
)


@dataclass(frozen=True)
class WorkflowBundle:
    """A v2 agent: the workflow class, its grader, and their configs."""

    workflow_cls: type[AgentWorkflow[Any]]
    workflow_config: AgentWorkflowConfig | None = None
    grader_cls: type[Grader] | None = None
    grader_config: GraderConfig | None = None

    @property
    def name(self) -> str:
        return self.workflow_config.name if self.workflow_config else self.workflow_cls.__name__

    @property
    def max_concurrent(self) -> int | None:
        return self.workflow_config.concurrency.max_concurrent if self.workflow_config else None


def _deadline_message(phase: str, limit: float | None, queued_sec: float = 0.0) -> str:
    message = f"{phase} exceeded its {limit}s deadline"
    if queued_sec >= 0.1:
        message += f" ({queued_sec:.1f}s of it spent queued)"
    return message


def _failure(
    exc: BaseException,
    deadline: asyncio.Timeout,
    phase: str,
    limit: float | None,
    queued_sec: float = 0.0,
    sample: RolloutSample | None = None,
) -> ExecutionResult:
    # A user-raised TimeoutError keeps its own message; ours names the deadline that fired.
    expired = deadline.expired()
    message = _deadline_message(phase, limit, queued_sec) if expired else describe(exc)
    return ExecutionResult(
        status=RolloutStatus.FAILURE,
        sample=sample,
        err_message=message or type(exc).__name__,
        err_category=categorize_exception(exc),
    )


def _overran(deadline: asyncio.Timeout, started: float, budget: float | None) -> bool:
    """Returned after the budget (swallowed cancellation, or blocked the loop): a timeout."""
    return budget is not None and (deadline.expired() or time.monotonic() - started > budget)


async def _samples_of(
    output: Any, request: ExecutionRequest, ctx: RolloutContext
) -> dict[str, RolloutSample]:
    """The samples a workflow produced: from its return value, else its sample sources."""
    try:
        coerced = coerce_output(output)
    except UnsupportedOutputError:
        # [decision] seed-era workflows returned anything (e.g. a Strands AgentResult) and
        # relied on their sample source; keep that working, fail only without a source.
        if ctx.sample_source is None:
            raise
        logger.warning(
            "rollout %s: run() returned a %s; using its sample source",
            request.id,
            type(output).__name__,
        )
        return await ctx.get_samples()
    if coerced is None:
        return await ctx.get_samples()
    if coerced.messages is None:
        return {}
    sample = RolloutSample(
        id=request.id, messages=coerced.messages, label=request.label, metrics=coerced.metrics
    )
    return {request.id: sample}


async def run_workflow(
    bundle: WorkflowBundle,
    request: ExecutionRequest,
    ctx: RolloutContext,
    *,
    queued_sec: float = 0.0,
    artifacts: Path | None = None,
) -> ExecutionResult:
    """The workflow on a fresh instance and config copy, within what is left of its budget."""
    config = copy.deepcopy(bundle.workflow_config)
    workflow_ctx: AgentWorkflowContext[Any] = AgentWorkflowContext(
        prompt=request.prompt, config=config, metadata=request.metadata, artifacts_dir=artifacts
    )
    budget = (
        max(request.agent_timeout_sec - queued_sec, 0.0)
        if request.agent_timeout_sec is not None
        else None
    )
    started = time.monotonic()
    deadline = asyncio.timeout(budget)
    try:
        async with deadline:
            with ctx:
                output = await bundle.workflow_cls(config).run(workflow_ctx)
                samples = await _samples_of(output, request, ctx)
    except Exception as exc:
        logger.info("rollout %s: workflow failed: %r", request.id, exc, exc_info=True)
        return _failure(exc, deadline, "workflow", request.agent_timeout_sec, queued_sec)
    if _overran(deadline, started, budget):
        return ExecutionResult(
            status=RolloutStatus.FAILURE,
            err_message=_deadline_message("workflow", request.agent_timeout_sec, queued_sec),
            err_category=RolloutErrorCategory.TIMEOUT,
        )
    return ExecutionResult(
        status=RolloutStatus.SUCCESS, sample=next(iter(samples.values()), None), samples=samples
    )


def _check_rewarded(ctx: GraderContext) -> None:
    if ctx.sample is None:
        raise ValueError(
            "No sample to grade. The workflow must return messages or register a sample "
            "source (e.g. via OsmosisStrandsAgent or OsmosisMemorySession) before grading."
        )
    for sample in [ctx.sample, *ctx.samples.values()]:
        if not sample.remove_sample and sample.reward is None:
            raise ValueError("Sample has no reward after grading")


async def run_grader(
    bundle: WorkflowBundle,
    request: ExecutionRequest,
    result: ExecutionResult,
    artifacts: Path | None = None,
) -> ExecutionResult:
    """The grader on a fresh instance, under its own deadline (independent of the agent's)."""
    assert bundle.grader_cls is not None
    grader_ctx = GraderContext(
        label=request.label,
        sample=result.sample,
        samples=result.samples,
        metadata=request.metadata,
        artifacts_dir=artifacts,
    )
    budget = request.grader_timeout_sec
    started = time.monotonic()
    deadline = asyncio.timeout(budget)
    try:
        async with deadline:
            await bundle.grader_cls(bundle.grader_config).grade(grader_ctx)
            _check_rewarded(grader_ctx)
    except Exception as exc:
        logger.info("rollout %s: grader failed: %r", request.id, exc, exc_info=True)
        return _failure(exc, deadline, "grader", budget, sample=result.sample).model_copy(
            update={"samples": result.samples}
        )
    if _overran(deadline, started, budget):
        return ExecutionResult(
            status=RolloutStatus.FAILURE,
            sample=result.sample,
            samples=result.samples,
            err_message=_deadline_message("grader", budget),
            err_category=RolloutErrorCategory.TIMEOUT,
        )
    return ExecutionResult(
        status=RolloutStatus.SUCCESS, sample=grader_ctx.sample, samples=grader_ctx.samples
    )


def _ungradable(bundle: WorkflowBundle, request: ExecutionRequest) -> str | None:
    if bundle.grader_cls is None:
        return "no grader is configured"
    if request.label is None and request.metadata is None:
        return "the row has neither a label nor metadata"
    return None


async def execute_rollout(
    bundle: WorkflowBundle,
    request: ExecutionRequest,
    ctx: RolloutContext,
    *,
    queued_sec: float = 0.0,
) -> ExecutionOutcome:
    """Workflow, then (when requested and possible) grading; reports ``grading`` on ``ctx``.
    Both see the rollout's one artifacts directory, and share its answers' budget
    (``OSMOSIS_ROLLOUT_CLIENT_MAX_ROLLOUT_ANSWERS_MB``)."""
    with reading_answers(get_settings().client.max_rollout_answers_mb):
        return await _execute(bundle, request, ctx, queued_sec)


async def _execute(
    bundle: WorkflowBundle, request: ExecutionRequest, ctx: RolloutContext, queued_sec: float
) -> ExecutionOutcome:
    artifacts = await artifacts_dir(request.id)
    result = await run_workflow(bundle, request, ctx, queued_sec=queued_sec, artifacts=artifacts)
    if not request.grade or result.status is not RolloutStatus.SUCCESS:
        return ExecutionOutcome(workflow=result)
    reason = _ungradable(bundle, request)
    if reason is not None:
        # [decision] the reference fails with no message; say why, as a validation error.
        return ExecutionOutcome(
            workflow=result,
            grader=ExecutionResult(
                status=RolloutStatus.FAILURE,
                sample=result.sample,
                err_message=UNGRADABLE_MESSAGE.format(reason=reason),
                err_category=RolloutErrorCategory.VALIDATION_ERROR,
            ),
        )
    await ctx.set_status(RolloutStatus.GRADING)
    graded = await run_grader(bundle, request, result, artifacts)
    return ExecutionOutcome(workflow=result, grader=graded)


__all__ = ["WorkflowBundle", "artifacts_dir", "execute_rollout", "run_grader", "run_workflow"]
