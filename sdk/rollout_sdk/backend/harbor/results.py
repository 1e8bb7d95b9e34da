"""A finished Harbor trial as a rollout's result: reward, timings, trajectory."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from rollout_sdk.types.sample import (
    ExecutionOutcome,
    ExecutionResult,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
)

logger = logging.getLogger(__name__)

# Harbor's phases, by the name the sample's metrics give their seconds.
PHASES = {
    "environment_setup_sec": "environment_setup",
    "agent_setup_sec": "agent_setup",
    "agent_sec": "agent_execution",
    "verifier_sec": "verifier",
}
TIMEOUT_EXCEPTIONS = ("AgentTimeoutError", "VerifierTimeoutError", "TimeoutError")
# Harbor's errors when the task's own tests misbehave: the task's fault, not the agent's.
TASK_FAULTS = (
    "RewardFileNotFoundError",
    "RewardFileEmptyError",
    "VerifierOutputParseError",
    "OverflowError",
)
NOT_FINITE = "the task's tests gave a reward that is not a finite number"
# A reward's name becomes a metric's: the task writes it, so it is held to a short plain name.
REWARD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
MAX_REWARDS = 16
MESSAGE_CAP = 300
# Harbor's message for a failed compose command carries the command and all it printed (the
# task's files and paths, a registry's answer): only the step and its code are kept.
COMPOSE_FAILED = re.compile(
    r"Docker compose command failed.*?Command: .*? (\w+)(?: [^.]*)?\. Return code: (-?\d+)", re.S
)


def harbor_message(error: Any) -> str:
    """A trial's exception as one short line of Harbor's own words: never what a sandbox
    printed (a compose failure's output, past ``Stdout:``), never control characters."""
    text = str(getattr(error, "exception_message", "") or "")
    compose = COMPOSE_FAILED.search(text)
    if compose is not None:
        text = f"docker compose {compose.group(1)} failed (return code {compose.group(2)})"
    text = text.split(" Stdout:", 1)[0]
    text = "".join(c if c.isprintable() else " " for c in text)
    kind = str(getattr(error, "exception_type", "") or "Error")
    return f"{kind}: {text[:MESSAGE_CAP]}".strip().rstrip(":")


def finite(value: Any) -> float | None:
    """``value`` as a finite float; None when it is none (too large, NaN, not a number)."""
    try:
        found = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return found if math.isfinite(found) else None


def _rewards(result: Any) -> tuple[float | None, dict[str, float], bool]:
    """The verifier's reward, its other rewards as metrics, and whether all were finite."""
    rewards = getattr(getattr(result, "verifier_result", None), "rewards", None) or {}
    if not isinstance(rewards, dict):
        return None, {}, False
    raw = rewards.get("reward", next(iter(rewards.values()), None)) if rewards else None
    named = [k for k in rewards if k != "reward" and REWARD_NAME.fullmatch(str(k))]
    others = {f"reward_{k}": finite(rewards[k]) for k in named[:MAX_REWARDS]}
    reward = finite(raw) if raw is not None else None
    ok = (raw is None or reward is not None) and None not in others.values()
    return reward, {k: v for k, v in others.items() if v is not None}, ok


READ_CAP_BYTES = 64 * 2**20


def read_written(path: Path, cap: int = READ_CAP_BYTES) -> str | None:
    """A file a sandbox wrote, as text: None when it is missing, not a regular file (a link
    the sandbox made would lead anywhere on this host: it is not followed) or over ``cap``."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as source:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        data = source.read(cap + 1)
    if len(data) > cap:
        logger.warning("%s is over %d bytes; it is not read", path.name, cap)
        return None
    return data.decode(errors="replace")


def timings(result: Any) -> dict[str, float]:
    """Seconds per phase (and ``trial_sec`` in all) from the trial's own time records."""
    spans = {name: getattr(result, attr, None) for name, attr in PHASES.items()}
    spans["trial_sec"] = result
    found: dict[str, float] = {}
    for name, span in spans.items():
        start = getattr(span, "started_at", None)
        end = getattr(span, "finished_at", None)
        if start is not None and end is not None:
            found[name] = round((end - start).total_seconds(), 3)
    return found


ROLES = {"user": "user", "agent": "assistant", "system": "system"}


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    """ATIF tool calls in the chat shape (arguments as a JSON string)."""
    return [
        {
            "id": call.get("tool_call_id"),
            "type": "function",
            "function": {
                "name": call.get("function_name"),
                "arguments": json.dumps(
                    call.get("arguments") or {}, ensure_ascii=False, default=str
                ),
            },
        }
        for call in (raw if isinstance(raw, list) else [])
        if isinstance(call, dict)
    ]


def messages_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages from an agent's trajectory document, as upstream reads them: a
    ``messages`` list as is; ATIF ``steps`` each as a message of its source's role (``agent``:
    ``assistant``, with its tool calls and reasoning; an unknown source: ``tool``) followed by
    one ``tool`` message per observation result. A step with neither text nor tool calls adds
    no message (it would make turns that never happened)."""
    if isinstance(document.get("messages"), list):
        return list(document["messages"])
    messages: list[dict[str, Any]] = []
    for step in document.get("steps") or []:
        role = ROLES.get(step.get("source"), "tool")
        content = step.get("message")
        calls = _tool_calls(step.get("tool_calls")) if role == "assistant" else []
        if content is not None or calls:
            message: dict[str, Any] = {
                "role": role,
                "content": content if content is not None else "",
            }
            if role == "assistant" and step.get("reasoning_content") is not None:
                message["reasoning_content"] = step["reasoning_content"]
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
        observation = step.get("observation")
        found = observation.get("results") if isinstance(observation, dict) else None
        for result in found or []:
            if isinstance(result, dict):
                reply: dict[str, Any] = {"role": "tool", "content": result.get("content") or ""}
                if result.get("source_call_id") is not None:
                    reply["tool_call_id"] = result["source_call_id"]
                messages.append(reply)
    return messages


def trajectory_messages(trial_dir: Path) -> list[dict[str, Any]] | None:
    """The agent's trajectory (``agent/trajectory.json``, ATIF) as chat messages; None when
    the agent wrote none (``oracle`` talks to no model) or it is not JSON."""
    path = trial_dir / "agent" / "trajectory.json"
    text = read_written(path)
    if text is None:
        return None
    try:
        document = json.loads(text)
    except (OSError, ValueError):
        logger.warning("%s is not JSON; the rollout keeps no trajectory", path)
        return None
    return messages_of(document) if isinstance(document, dict) else None


def usage(result: Any) -> dict[str, float]:
    """Token and cost totals Harbor counted over the trial (upstream's sample metrics)."""
    try:
        totals = result.compute_token_cost_totals()
    except Exception:
        return {}
    names = ("input_tokens", "cached_tokens", "output_tokens", "cost_usd")
    return {
        name: float(value) for name, value in zip(names, totals, strict=False) if value is not None
    }


def _stored(path: Path) -> ExecutionResult | None:
    try:
        text = read_written(path)
        return None if text is None else ExecutionResult.model_validate_json(text)
    except (OSError, ValueError):
        return None


def workflow_outcome(
    result: Any, trial_dir: Path, seconds: dict[str, float], graded: bool
) -> ExecutionOutcome:
    """A sandboxed AgentWorkflow's outcome: its own result (and the Grader's, when the Grader
    was the verifier), or the task's tests' reward on its sample."""
    ran = _stored(trial_dir / "agent" / "rollout-result.json")
    error = getattr(result, "exception_info", None)
    if ran is None:
        output = trial_dir / "agent" / "workflow-output.txt"
        said = (read_written(output) or "").strip().splitlines()[-1:]
        reason = (
            harbor_message(error)
            if error is not None
            else (said[0][:300] if said else "it wrote no result")
        )
        failed = ExecutionResult(
            status=RolloutStatus.FAILURE,
            err_message=f"the workflow did not finish in its sandbox: {reason}",
            err_category=RolloutErrorCategory.AGENT_ERROR,
            extra_fields={"timings": seconds},
        )
        return ExecutionOutcome(workflow=failed)
    ran = _with_timings(ran, seconds)
    if not graded or ran.status is not RolloutStatus.SUCCESS:
        return ExecutionOutcome(workflow=ran)
    grader = _stored(trial_dir / "verifier" / "rollout-graded.json")
    if grader is not None:
        return ExecutionOutcome(workflow=ran, grader=_with_timings(grader, seconds))
    reward, _, finite_rewards = _rewards(result)
    if not finite_rewards:
        failed = ran.model_copy(
            update={
                "status": RolloutStatus.FAILURE,
                "err_message": NOT_FINITE,
                "err_category": RolloutErrorCategory.VALIDATION_ERROR,
            }
        )
        return ExecutionOutcome(workflow=ran, grader=failed)
    if reward is None or ran.sample is None:
        failed = ran.model_copy(
            update={
                "status": RolloutStatus.FAILURE,
                "err_message": "the task's tests gave no reward"
                + (f" ({harbor_message(error)})" if error else ""),
                "err_category": RolloutErrorCategory.AGENT_ERROR,
            }
        )
        return ExecutionOutcome(workflow=ran, grader=failed)
    sample = ran.sample.model_copy(update={"reward": reward})
    return ExecutionOutcome(workflow=ran, grader=ran.model_copy(update={"sample": sample}))


def _with_timings(result: ExecutionResult, seconds: dict[str, float]) -> ExecutionResult:
    if result.sample is None:
        return result
    metrics = {**result.sample.metrics, **seconds}
    return result.model_copy(
        update={"sample": result.sample.model_copy(update={"metrics": metrics})}
    )


def outcome(
    result: Any,
    trial_dir: Path,
    *,
    graded: bool,
    workflow: bool = False,
    silent: bool = False,
) -> ExecutionOutcome:
    """The rollout's outcome: success with the verifier's reward, or a failure whose message
    is the trial's exception (type and message, never a traceback). A Harbor agent's sample is
    its trajectory; a ``silent`` one (``oracle``) has none and a sample without messages."""
    seconds = timings(result)
    if workflow:
        return workflow_outcome(result, trial_dir, seconds, graded)
    trajectory = trajectory_messages(trial_dir)
    error = getattr(result, "exception_info", None)
    if trajectory is None and not silent and error is None:
        missing = ExecutionResult(
            status=RolloutStatus.FAILURE,
            err_message="the agent wrote no trajectory (agent/trajectory.json) to train on",
            err_category=RolloutErrorCategory.AGENT_ERROR,
            extra_fields={"timings": seconds},
        )
        return ExecutionOutcome(workflow=missing)
    messages = trajectory or []
    reward, others, finite_rewards = _rewards(result)
    sample = RolloutSample(
        messages=messages, reward=reward, metrics={**usage(result), **seconds, **others}
    )
    if not finite_rewards:
        failed = ExecutionResult(
            status=RolloutStatus.FAILURE,
            sample=sample,
            err_message=NOT_FINITE,
            err_category=RolloutErrorCategory.VALIDATION_ERROR,
        )
        return ExecutionOutcome(workflow=failed)
    if error is not None:
        category = (
            RolloutErrorCategory.TIMEOUT
            if error.exception_type in TIMEOUT_EXCEPTIONS
            else RolloutErrorCategory.VALIDATION_ERROR
            if error.exception_type in TASK_FAULTS
            else RolloutErrorCategory.AGENT_ERROR
        )
        text = harbor_message(error)
        failed = ExecutionResult(
            status=RolloutStatus.FAILURE,
            sample=sample,
            err_message=f"the Harbor trial failed: {text}",
            err_category=category,
            extra_fields={"timings": seconds},
        )
        return ExecutionOutcome(workflow=failed)
    if graded and sample.reward is None:
        missing = ExecutionResult(
            status=RolloutStatus.FAILURE,
            sample=sample,
            err_message="the task's tests gave no reward (tests/test.sh must write "
            "/logs/verifier/reward.txt or reward.json)",
            err_category=RolloutErrorCategory.AGENT_ERROR,
        )
        return ExecutionOutcome(workflow=missing)
    done = ExecutionResult(
        status=RolloutStatus.SUCCESS, sample=sample, extra_fields={"timings": seconds}
    )
    return ExecutionOutcome(workflow=done)


__all__ = ["PHASES", "messages_of", "outcome", "timings", "trajectory_messages", "usage"]
