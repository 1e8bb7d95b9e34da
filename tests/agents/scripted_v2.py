"""A v2 workflow and grader whose behaviour each row picks through ``metadata``.

``metadata["script"]`` — workflow steps, in order (default: one chat):

    {"chat": {...}}            one non-streaming chat call (plain HTTP), reply appended
    {"chats": [n, every_s]}    n chat calls, every_s apart (a long, chatty rollout)
    {"register": name}         register a sample source named ``name`` (seed shape)
    {"sleep": s}               asyncio.sleep          {"block": s}  time.sleep (blocks the loop)
    {"raise": ["Type", "m"]}   raise Type(m) (RuntimeError, ValueError, TimeoutError, ...)
    {"echo": true}             append what the workflow saw (prompt, metadata, label?, state)
    {"return": "int"|"none"|"empty"}  return 42 / None / AgentWorkflowOutput(messages=None)

The workflow returns its message list. ``metadata["grade"]`` — grader steps:

    {"sleep": s}  {"raise": ["Type", "m"]}  {"reward": x|"nan"}  {"remove": true}
    {"poison": true}  put a NaN and an unencodable object into metrics/extra_fields
    {"reward_each": x}  set_sample_reward(id, x) for every sample (seed shape)
    {"answer": true}  reward 1.0 if the last message answers ``#### <label>``, else 0.0

The grader copies what it saw (label, metadata) into ``sample.extra_fields``.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import time
from typing import Any

import httpx

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    RolloutSample,
    SampleSource,
    get_rollout_context,
)
from rollout_sdk.client.headers import llm_call_headers

ERRORS = {"RuntimeError": RuntimeError, "ValueError": ValueError, "TimeoutError": TimeoutError}


class FixedSource(SampleSource):
    """A sample source whose sample says who it is."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def get_sample(self, *args: Any) -> RolloutSample:
        return RolloutSample(messages=[{"role": "assistant", "content": f"from {self.name}"}])


class ScriptedConfig(AgentWorkflowConfig):
    name: str = "scripted-v2"
    visits: int = 0


scripted_config = ScriptedConfig()


# Built once: a client built with its own TLS context loads the CA bundle on the event loop
# (0.5 s each on a loaded machine, measured), and a hundred rollouts chatting at once kept
# their worker's loop from renewing its leases (the chaos suite's long rollouts).
TLS = ssl.create_default_context()


async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    ctx = get_rollout_context()
    assert ctx is not None
    headers = llm_call_headers(ctx.rollout_id, ctx.rollout_id)  # any id, P§2.11
    if ctx.api_key:
        headers["Authorization"] = f"Bearer {ctx.api_key}"
    async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
        response = await client.post(
            f"{ctx.chat_completions_url}/chat/completions",
            json={"model": "osmosis-rollout", "messages": messages},
            headers=headers,
        )
    response.raise_for_status()
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


class ScriptedWorkflow(AgentWorkflow[ScriptedConfig]):
    instance_runs = 0

    async def run(self, ctx: AgentWorkflowContext[ScriptedConfig]) -> Any:
        self.instance_runs += 1
        assert ctx.config is not None
        ctx.config.visits += 1
        messages = list(ctx.prompt)
        for step in (ctx.metadata or {}).get("script", [{"chat": {}}]):
            action, argument = next(iter(step.items()))
            if action == "chat":
                messages.append(await chat(messages))
            elif action == "chats":
                for _ in range(argument[0]):
                    messages.append(await chat(messages))
                    await asyncio.sleep(argument[1])
            elif action == "register":
                rollout = get_rollout_context()
                assert rollout is not None
                rollout.register_sample_source(argument, FixedSource(argument))
            elif action == "sleep":
                await asyncio.sleep(argument)
            elif action == "block":
                time.sleep(argument)  # noqa: ASYNC251 - the point: a workflow that blocks its loop
            elif action == "raise":
                raise ERRORS[argument[0]](argument[1])
            elif action == "echo":
                seen = {
                    "prompt": ctx.prompt,
                    "metadata": ctx.metadata,
                    "has_label": hasattr(ctx, "label"),
                    "instance_runs": self.instance_runs,
                    "config_visits": ctx.config.visits,
                }
                messages.append({"role": "assistant", "content": json.dumps(seen)})
            elif action == "return":
                return {"int": 42, "none": None, "empty": AgentWorkflowOutput()}[argument]
        return messages


class ScriptedGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.sample.extra_fields["seen_label"] = ctx.label
        ctx.sample.extra_fields["seen_metadata"] = ctx.metadata
        for step in (ctx.metadata or {}).get("grade", [{"reward": 1.0}]):
            action, argument = next(iter(step.items()))
            if action == "sleep":
                await asyncio.sleep(argument)
            elif action == "raise":
                raise ERRORS[argument[0]](argument[1])
            elif action == "reward":
                ctx.set_reward(math.nan if argument == "nan" else argument)
            elif action == "answer":
                last = ctx.sample.messages[-1] if ctx.sample.messages else {}
                ctx.set_reward(1.0 if last.get("content") == f"#### {ctx.label}" else 0.0)
            elif action == "reward_each":
                for sample_id in ctx.get_samples():
                    ctx.set_sample_reward(sample_id, argument)
            elif action == "remove":
                ctx.sample.remove_sample = True
            elif action == "poison":
                ctx.sample.metrics["nan"] = math.nan
                ctx.sample.metrics["fine"] = 1.5
                ctx.sample.extra_fields["object"] = object()
