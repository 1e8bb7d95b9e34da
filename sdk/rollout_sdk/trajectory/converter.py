"""A rollout sample's ``trajectory_messages`` (OpenAI chat shape) → an ATIF document.

Roles map to step sources (``assistant`` → agent, ``system``/``developer`` → system, others
→ user with the role kept); ``tool`` messages become observations of the agent step that
called them. What ATIF has no field for is kept under ``extra``, so the conversion loses
nothing and one odd message never fails the document.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from rollout_sdk.trajectory.atif import (
    Agent,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
    Trajectory,
)
from rollout_sdk.trajectory.report import LlmCallMetrics, SampleReport
from rollout_sdk.types.sample import RolloutSample

logger = logging.getLogger(__name__)

PRODUCER = "rollout-sdk"
Source = Literal["system", "user", "agent"]
_SOURCES: dict[str, Source] = {
    "assistant": "agent",
    "system": "system",
    "developer": "system",
    "user": "user",
}


def _producer_version() -> str:
    try:
        return importlib.metadata.version(PRODUCER)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def convert_sample_to_trajectory(
    sample: RolloutSample,
    *,
    rollout_id: str,
    request_label: str | None = None,
    request_metadata: dict[str, Any] | None = None,
    request_extra_fields: dict[str, Any] | None = None,
    report: SampleReport | None = None,
    default_model_name: str | None = None,
    unmatched_sample_reports: Mapping[str, SampleReport] | None = None,
) -> Trajectory:
    """The ATIF document of ``sample``; ``ValueError`` when it has no trajectory messages.

    A ``report`` whose call count matches the agent steps puts its metrics on them, in
    order; otherwise its calls are kept under ``extra.osmosis``, as are reports that could
    not be attributed (``unmatched_sample_reports``) and the rollout's context (id, label,
    reward, the request's metadata and extra fields).
    """
    if sample.trajectory_messages is None:
        raise ValueError("Sample has no trajectory-compatible messages")
    steps = _steps(sample.trajectory_messages)
    unmatched_calls = _overlay(steps, report)
    totals = _totals(report) or FinalMetrics()
    totals.total_steps = len(steps)
    context: dict[str, Any] = {
        "rollout_id": rollout_id,
        "label": sample.label if sample.label is not None else request_label,
        "reward": sample.reward,
        "sample_metrics": sample.metrics or None,
        "sample_extra_fields": sample.extra_fields or None,
        "request_metadata": request_metadata,
        "request_extra_fields": request_extra_fields,
        "unmatched_llm_call_metrics": unmatched_calls,
        "unmatched_sample_reports": {
            key: value.model_dump(exclude_none=True)
            for key, value in (unmatched_sample_reports or {}).items()
        }
        or None,
    }
    return Trajectory(
        session_id=rollout_id,
        trajectory_id=rollout_id,
        agent=Agent(
            name=PRODUCER,
            version=_producer_version(),
            model_name=(report.model_name if report else None) or default_model_name,
        ),
        steps=steps,
        final_metrics=totals,
        extra={"osmosis": {key: value for key, value in context.items() if value is not None}},
    )


def _steps(messages: Sequence[Mapping[str, Any]]) -> list[Step]:
    steps: list[Step] = []
    for message in messages:
        role = str(message.get("role", ""))
        if role in ("tool", "function"):
            _observe(steps, message)
            continue
        source = _SOURCES.get(role, "user")
        extra: dict[str, Any] = {} if role in _SOURCES else {"original_role": role}
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            reasoning = json.dumps(reasoning, ensure_ascii=False, default=str)
        calls = _tool_calls(message.get("tool_calls"))
        if source != "agent":
            # ATIF allows these on agent steps only: keep them, outside the checked fields.
            if reasoning is not None:
                extra["reasoning_content"] = reasoning
            if calls:
                extra["tool_calls"] = [call.model_dump(exclude_none=True) for call in calls]
            reasoning, calls = None, None
        metrics = _usage(message) if source == "agent" else None
        steps.append(
            Step(
                step_id=len(steps) + 1,
                timestamp=_timestamp(message),
                source=source,
                message=_text(message.get("content")),
                reasoning_content=reasoning,
                tool_calls=calls,
                model_name=_model(message) if source == "agent" else None,
                metrics=metrics,
                llm_call_count=1 if metrics else None,
                extra=extra or None,
            )
        )
    return steps


def _as_iso(value: Any) -> str | None:
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, tz=UTC).isoformat()
        if isinstance(value, str):
            return datetime.fromisoformat(value.replace("Z", "+00:00")).isoformat()
    except (OSError, OverflowError, ValueError):
        return None
    return None


def _timestamp(message: Mapping[str, Any]) -> str | None:
    for key in ("created_at", "timestamp", "completed_at"):
        if found := _as_iso(message.get(key)):
            return found
    extra = message.get("extra")
    return _as_iso(extra.get("timestamp")) if isinstance(extra, Mapping) else None


def _raw_response(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """The completion response some frameworks keep under ``extra.response``."""
    extra = message.get("extra")
    response = extra.get("response") if isinstance(extra, Mapping) else None
    return response if isinstance(response, Mapping) else {}


def _model(message: Mapping[str, Any]) -> str | None:
    model = message.get("model") or message.get("model_name") or _raw_response(message).get("model")
    return str(model) if model else None


def _first_present(mapping: Mapping[str, Any], *keys: str) -> Any:
    # ``is None``, not ``or``: a real 0 must not fall through to the other API's name.
    return next((mapping[key] for key in keys if mapping.get(key) is not None), None)


def _usage(message: Mapping[str, Any]) -> Metrics | None:
    """Usage on the message (``usage``, or the raw response's), in Chat Completions' or
    the Responses API's names."""
    usage = message.get("usage")
    if not isinstance(usage, Mapping):
        usage = _raw_response(message).get("usage")
    if not isinstance(usage, Mapping):
        return None
    input_details = _first_present(usage, "prompt_tokens_details", "input_tokens_details")
    cached = usage.get("cached_tokens")
    if cached is None and isinstance(input_details, Mapping):
        cached = input_details.get("cached_tokens")
    details = {
        key: dict(value)
        for key in (
            "prompt_tokens_details",
            "input_tokens_details",
            "completion_tokens_details",
            "output_tokens_details",
        )
        if isinstance(value := usage.get(key), Mapping) and value
    }
    try:
        metrics = Metrics(
            prompt_tokens=_first_present(usage, "prompt_tokens", "input_tokens"),
            completion_tokens=_first_present(usage, "completion_tokens", "output_tokens"),
            cached_tokens=cached,
            cost_usd=usage.get("cost_usd"),
            extra=details or None,
        )
    except ValidationError:
        return None
    return metrics if metrics.model_dump(exclude_none=True) else None


def _overlay(steps: list[Step], report: SampleReport | None) -> list[dict[str, Any]] | None:
    """Put the report's per-call metrics on the agent steps, in order, when the counts
    match; otherwise return them to be kept aside (a guess would misattribute them)."""
    if report is None or not report.llm_call_metrics:
        return None
    agent_steps = [step for step in steps if step.source == "agent"]
    if len(agent_steps) != len(report.llm_call_metrics):
        return [call.model_dump(exclude_none=True) for call in report.llm_call_metrics]
    for step, call in zip(agent_steps, report.llm_call_metrics, strict=True):
        reported = _call_metrics(call)
        if reported is not None:
            # Field by field: a count-only report keeps the message's own token ids.
            step.metrics = (
                reported
                if step.metrics is None
                else step.metrics.model_copy(update=reported.model_dump(exclude_none=True))
            )
        step.model_name = call.model_name or step.model_name
        step.llm_call_count = 1
    return None


def _call_metrics(call: LlmCallMetrics) -> Metrics | None:
    fields = call.model_dump(exclude={"model_name"}, exclude_none=True)
    return Metrics.model_validate(fields) if fields else None


def _totals(report: SampleReport | None) -> FinalMetrics | None:
    """The report's own totals, else the sums of its calls."""
    if report is None:
        return None
    given = {k: v for k, v in (report.final_metrics or {}).items() if k != "total_steps"}
    if given:
        try:
            return FinalMetrics.model_validate(given)
        except ValidationError:
            logger.warning("ignoring malformed final_metrics in a trajectory report")
    calls = report.llm_call_metrics

    def total(field: str) -> Any:
        values = [getattr(call, field) for call in calls if getattr(call, field) is not None]
        return sum(values) if values else None

    totals = FinalMetrics(
        total_prompt_tokens=total("prompt_tokens"),
        total_completion_tokens=total("completion_tokens"),
        total_cached_tokens=total("cached_tokens"),
        total_cost_usd=total("cost_usd"),
    )
    return totals if totals.model_dump(exclude_none=True) else None


def _observe(steps: list[Step], message: Mapping[str, Any]) -> None:
    """A tool result joins the observation of the agent step just before it; one with no
    agent step before it becomes a system step of its own."""
    call_id = message.get("tool_call_id")
    caller = steps[-1] if steps and steps[-1].source == "agent" else None
    known = {call.tool_call_id for call in (caller.tool_calls or ())} if caller else set()
    matched = call_id in known
    result = ObservationResult(
        source_call_id=call_id if matched else None,
        content=_text(message.get("content")),
        extra=None if matched else {"tool_call_id": call_id},
    )
    if caller is None:
        steps.append(
            Step(
                step_id=len(steps) + 1,
                source="system",
                message="",
                observation=Observation(results=[result]),
                extra={"original_role": str(message.get("role", "tool"))},
            )
        )
    elif caller.observation is None:
        caller.observation = Observation(results=[result])
    else:
        caller.observation.results.append(result)


def _tool_calls(raw: Any) -> list[ToolCall] | None:
    if not raw or isinstance(raw, str) or not isinstance(raw, Sequence):
        return None
    calls = []
    for index, item in enumerate(raw):
        if isinstance(item, Mapping):
            function = item.get("function")
            function = function if isinstance(function, Mapping) else {}
            calls.append(
                ToolCall(
                    tool_call_id=str(item.get("id") or f"call_{index}"),
                    function_name=str(function.get("name") or "unknown"),
                    arguments=_arguments(function.get("arguments")),
                )
            )
    return calls or None


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str) or not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"_raw": raw}


def _text(content: Any) -> str:
    """Message content as text: text parts joined by lines, anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [part for part in content if isinstance(part, Mapping)]
        if parts and all(part.get("type") == "text" for part in parts):
            return "\n".join(str(part.get("text", "")) for part in parts)
    return json.dumps(content, ensure_ascii=False, default=str)


__all__ = ["PRODUCER", "convert_sample_to_trajectory"]
