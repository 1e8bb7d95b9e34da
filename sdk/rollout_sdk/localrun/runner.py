"""Running dataset rows through an agent in this process, against an LLM behind an
:class:`~rollout_sdk.localrun.bridge.LLMBridge` (``rollout-sdk test``).

A row runs exactly as it would on a rollout server: v1 rows through ``get_tools`` and
``run_agent_loop`` (SDK.md §1.15: ``rollout_id = "test-<row>"``, the row's other columns in
the request metadata), v2 rows through ``execute_rollout`` (workflow, then grader).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.backend.execution import WorkflowBundle, execute_rollout
from rollout_sdk.client import OsmosisLLMClient
from rollout_sdk.config import RolloutSettings, get_settings
from rollout_sdk.context import RolloutContext as V2Context
from rollout_sdk.core.base import RolloutAgentLoop, RolloutContext
from rollout_sdk.core.schemas import MessageDict, RolloutRequest
from rollout_sdk.core.schemas import RolloutStatus as V1Status
from rollout_sdk.loader import Agent
from rollout_sdk.localrun.bridge import LLMBridge, Usage
from rollout_sdk.localrun.dataset import DatasetRow
from rollout_sdk.runner import ToolsError, prepare_rollout, run_agent_loop
from rollout_sdk.types import (
    ExecutionRequest,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
)

LOCAL_SERVER_URL = "http://local-rollout.local"  # what the spec's test rows carry; unused
MAX_TOKENS_TOTAL = 4096
TOOL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
AGENT_ERROR = "agent_error"
LLM_ERROR = "llm_error"


@dataclass
class RowResult:
    """One row's outcome, as the report and the JSONL output carry it."""

    row_index: int
    rollout_id: str
    success: bool
    status: str
    reward: float | None = None
    error: str | None = None
    error_category: str | None = None
    finish_reason: str | None = None
    duration_ms: float = 0.0
    llm_calls: int = 0
    token_usage: dict[str, int] = field(default_factory=dict)
    messages: list[MessageDict] = field(default_factory=list)

    def as_dict(self, *, with_messages: bool = True) -> dict[str, Any]:
        row = asdict(self)
        if not with_messages:
            del row["messages"]
        return row


@dataclass(frozen=True)
class RunOptions:
    max_turns: int = 10
    completion_params: dict[str, Any] = field(default_factory=dict)
    log_dir: Path | None = None  # per-rollout traces: <log_dir>/<rollout_id>.jsonl
    agent_timeout_s: float | None = None  # v2 workflow deadline
    grader_timeout_s: float | None = None  # v2 grader deadline


def rollout_id_of(row: DatasetRow) -> str:
    return f"test-{row.index}"


def _check_tools(tools: Sequence[Any]) -> str | None:
    """Why these tools cannot go to an OpenAI-compatible LLM, or ``None``."""
    for tool in tools:
        function = tool.get("function", {}) if isinstance(tool, dict) else {}
        name = function.get("name", "")
        if not TOOL_NAME.match(str(name)):
            return f"tool name {name!r} must match {TOOL_NAME.pattern}"
        if (function.get("parameters") or {"type": "object"}).get("type") != "object":
            return f"tool {name!r}: parameters.type must be 'object'"
    return None


class LocalRunner:
    """Runs rows of one agent; a row's failure is its result, never an exception."""

    def __init__(
        self,
        agent: Agent,
        bridge: LLMBridge,
        options: RunOptions | None = None,
        settings: RolloutSettings | None = None,
    ) -> None:
        self.agent = agent
        self.bridge = bridge
        self.options = options or RunOptions()
        self._settings = settings or get_settings()

    async def run_row(
        self,
        row: DatasetRow,
        rollout_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RowResult:
        """Run one row (as ``rollout_id``, default ``test-<row>``); ``metadata`` is added to
        the request's (an evaluation's sample index)."""
        rollout_id = rollout_id or rollout_id_of(row)
        started = time.monotonic()
        if isinstance(self.agent, RolloutAgentLoop):
            result = await self._run_v1(self.agent, row, rollout_id, metadata or {})
        else:
            result = await self._run_v2(self.agent, row, rollout_id, metadata or {})
        settle(result, self.bridge.usage_of(rollout_id), started)
        await self._write_trace(result)
        return result

    async def run_rows(
        self,
        rows: Sequence[DatasetRow],
        concurrency: int = 1,
        on_done: Callable[[RowResult], Awaitable[None] | None] | None = None,
    ) -> list[RowResult]:
        """Every row, at most ``concurrency`` at once; stops starting rows once the LLM
        endpoint refuses for good (``bridge.fatal``: authentication, quota, unreachable)."""
        slots = asyncio.Semaphore(concurrency)
        results: list[RowResult] = []

        async def one(row: DatasetRow) -> None:
            async with slots:
                if self.bridge.fatal is not None:
                    return
                result = await self.run_row(row)
                results.append(result)
                if on_done is not None:
                    done = on_done(result)
                    if done is not None:
                        await done

        async with asyncio.TaskGroup() as group:
            for row in rows:
                group.create_task(one(row))
        return sorted(results, key=lambda result: result.row_index)

    async def _run_v1(
        self, agent_loop: RolloutAgentLoop, row: DatasetRow, rollout_id: str, extra: dict[str, Any]
    ) -> RowResult:
        request = RolloutRequest(
            rollout_id=rollout_id,
            server_url=LOCAL_SERVER_URL,
            messages=row.messages,
            completion_params=dict(self.options.completion_params),
            max_turns=self.options.max_turns,
            max_tokens_total=MAX_TOKENS_TOTAL,
            metadata={
                "ground_truth": row.ground_truth,
                "row_index": row.index,
                **row.extra,
                **extra,
                "execution_mode": "test",
                "test_mode": True,
            },
        )
        try:
            prepared = await asyncio.to_thread(prepare_rollout, agent_loop, request)
        except ToolsError as exc:
            return _failed(row, rollout_id, str(exc), RolloutErrorCategory.VALIDATION_ERROR)
        tools = [tool.model_dump(exclude_none=True) for tool in prepared.response.tools]
        problem = _check_tools(tools)
        if problem is not None:
            return _failed(row, rollout_id, problem, RolloutErrorCategory.VALIDATION_ERROR)
        self.bridge.tools[rollout_id] = tools
        log_dir = str(self.options.log_dir) if self.options.log_dir else None
        async with OsmosisLLMClient(
            self.bridge.url, rollout_id, self.bridge.key, settings=self._settings
        ) as client:
            ctx = RolloutContext(
                request, prepared.tools, client, _start_time=time.monotonic(), _debug_dir=log_dir
            )
            response = await run_agent_loop(agent_loop, ctx)
        succeeded = response.status is V1Status.COMPLETED
        return RowResult(
            row_index=row.index,
            rollout_id=rollout_id,
            success=succeeded,
            status=response.status.value,
            reward=response.reward,
            error=response.error_message,
            error_category=None if succeeded else AGENT_ERROR,
            finish_reason=response.finish_reason,
            messages=list(response.final_messages),
        )

    async def _run_v2(
        self,
        agent: WorkflowBundle | ExecutionBackend,
        row: DatasetRow,
        rollout_id: str,
        extra: dict[str, Any],
    ) -> RowResult:
        request = ExecutionRequest(
            id=rollout_id,
            prompt=row.messages,
            label=row.ground_truth,
            metadata={**(row.metadata or row.extra), **extra} or None,
            agent_timeout_sec=self.options.agent_timeout_s,
            grader_timeout_sec=self.options.grader_timeout_s,
        )
        ctx = V2Context(
            chat_completions_url=f"{self.bridge.url}/v1/rollouts/{rollout_id}",
            api_key=self.bridge.key,
            rollout_id=rollout_id,
        )
        if isinstance(agent, ExecutionBackend):  # runs the rollout its own way (a sandbox)
            with ctx:
                result = (await agent.execute(request)).result
        else:
            result = (await execute_rollout(agent, request, ctx)).result
        return v2_row_result(row.index, rollout_id, result)

    async def _write_trace(self, result: RowResult) -> None:
        log_dir, traces = self.options.log_dir, self.bridge.traces
        if log_dir is None or traces is None:
            return
        events = [*traces.pop(result.rollout_id, []), {"event": "row_result", **result.as_dict()}]
        lines = "".join(json.dumps(event, default=str) + "\n" for event in events)

        def append() -> None:
            with (log_dir / f"{result.rollout_id}.jsonl").open("a", encoding="utf-8") as trace:
                trace.write(lines)

        await asyncio.to_thread(append)


# A rollout failed this way after an LLM call failed failed because of that call.
BLAMED_ON_THE_LLM = {None, AGENT_ERROR, LLM_ERROR, RolloutErrorCategory.HTTP_ERROR.value}


def settle(result: RowResult, usage: Usage, started: float) -> RowResult:
    """Add what the bridge saw of the rollout to its result: duration, LLM calls and tokens.
    A rollout that failed after an LLM call failed is the LLM's failure, and its error is the
    one the configured endpoint gave (the agent only saw the bridge's 502 or 401)."""
    result.duration_ms = round((time.monotonic() - started) * 1000, 1)
    result.llm_calls = usage.calls
    result.token_usage = usage.token_usage()
    if not result.success and usage.errors and result.error_category in BLAMED_ON_THE_LLM:
        result.error_category = LLM_ERROR
        result.error = usage.errors[0]
    return result


class V2Outcome(Protocol):
    """What a v2 rollout ended with: an execution's result, or a polled wire result."""

    @property
    def status(self) -> RolloutStatus: ...
    @property
    def sample(self) -> RolloutSample | None: ...
    @property
    def err_message(self) -> str | None: ...
    @property
    def err_category(self) -> RolloutErrorCategory | None: ...


def v2_row_result(row_index: int, rollout_id: str, outcome: V2Outcome) -> RowResult:
    """A v2 rollout's outcome as a row result: the sample's reward and conversation."""
    sample = outcome.sample
    succeeded = outcome.status is RolloutStatus.SUCCESS
    return RowResult(
        row_index=row_index,
        rollout_id=rollout_id,
        success=succeeded,
        status=outcome.status.value,
        reward=sample.reward if sample is not None else None,
        error=outcome.err_message,
        error_category=outcome.err_category.value if outcome.err_category else None,
        messages=[dict(message) for message in sample.messages] if sample else [],
    )


def _failed(
    row: DatasetRow, rollout_id: str, message: str, category: RolloutErrorCategory
) -> RowResult:
    return RowResult(
        row_index=row.index,
        rollout_id=rollout_id,
        success=False,
        status="ERROR",
        error=message,
        error_category=category.value,
    )


__all__ = [
    "LocalRunner",
    "RowResult",
    "RunOptions",
    "rollout_id_of",
    "settle",
    "v2_row_result",
]
