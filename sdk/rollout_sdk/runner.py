"""Running one v1 rollout: tools for the init response, ``run`` → the completion body.

Both the in-process server (:func:`rollout_sdk.server.create_app`) and the fleet's
workers call these, so a rollout behaves the same wherever it runs (PROTOCOL.md §1.7).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rollout_sdk.client.capped import reading_answers
from rollout_sdk.config import get_settings
from rollout_sdk.core.base import RolloutAgentLoop, RolloutContext, RolloutResult
from rollout_sdk.core.foreign import describe
from rollout_sdk.core.schemas import (
    InitResponse,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
)

logger = logging.getLogger(__name__)


class ToolsError(Exception):
    """``get_tools`` raised or returned tools that do not fit the tool schema."""


@dataclass(frozen=True)
class PreparedRollout:
    """The init response plus the tools exactly as ``get_tools`` returned them."""

    response: InitResponse
    tools: list[Any]


def prepare_rollout(agent_loop: RolloutAgentLoop, request: RolloutRequest) -> PreparedRollout:
    """Call ``get_tools`` (synchronous user code: run it off the event loop) and build the 202."""
    try:
        tools = agent_loop.get_tools(request)
    except Exception as exc:
        raise ToolsError(f"get_tools() raised {type(exc).__name__}: {exc}") from exc
    try:
        response = InitResponse(rollout_id=request.rollout_id, tools=tools)
    except ValidationError as exc:
        raise ToolsError(f"get_tools() returned an invalid tool list: {exc}") from exc
    return PreparedRollout(response=response, tools=tools)


def error_response(
    rollout_id: str, message: str, ctx: RolloutContext | None = None
) -> RolloutResponse:
    """The ``ERROR`` body for a rollout whose agent crashed: LLM counters only."""
    return RolloutResponse(
        rollout_id=rollout_id,
        status=RolloutStatus.ERROR,
        final_messages=[],
        finish_reason="error",
        error_message=message,
        metrics=ctx.llm.get_metrics() if ctx is not None else None,
    )


def _to_response(rollout_id: str, result: Any, ctx: RolloutContext) -> RolloutResponse:
    if not isinstance(result, RolloutResult):
        return error_response(
            rollout_id,
            f"run() must return ctx.complete(...) or ctx.error(...), got {type(result).__name__}",
            ctx,
        )
    if result.status not in (RolloutStatus.COMPLETED, RolloutStatus.ERROR):
        return error_response(
            rollout_id, f"run() returned a result with unknown status {result.status!r}", ctx
        )
    try:
        return RolloutResponse(
            rollout_id=rollout_id,
            status=RolloutStatus(result.status),
            final_messages=result.final_messages,
            finish_reason=result.finish_reason,
            error_message=result.error_message,
            reward=result.reward,
            metrics=result.metrics or ctx.metrics(),
        )
    except ValidationError as exc:
        return error_response(rollout_id, f"run() returned an invalid result: {describe(exc)}", ctx)


async def run_agent_loop(agent_loop: RolloutAgentLoop, ctx: RolloutContext) -> RolloutResponse:
    """Run the agent and map every outcome to the completion body. Cancellation propagates."""
    rollout_id = ctx.request.rollout_id
    try:
        with reading_answers(get_settings().client.max_rollout_answers_mb):
            result = await agent_loop.run(ctx)
    except Exception as exc:
        logger.info("rollout %s: run() raised %s", rollout_id, type(exc).__name__, exc_info=True)
        return error_response(rollout_id, describe(exc), ctx)
    return _to_response(rollout_id, result, ctx)


__all__ = ["PreparedRollout", "ToolsError", "error_response", "prepare_rollout", "run_agent_loop"]
