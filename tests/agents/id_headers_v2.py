"""A v2 workflow that makes one LLM call through the SDK path its row names, with the sample
id its row names: every SDK path that sends ids in headers (P§2.11).

``metadata``: ``{"path": "openai" | "strands" | "openai_agents", "sample": <sample id>}``

* ``openai``: ``rollout_client(ctx, sample_id=sample)``, one non-streamed chat call;
* ``strands``: an ``OsmosisStrandsAgent`` named ``sample`` (its sample id), streamed;
* ``openai_agents``: an ``OsmosisAgent`` run with ``OsmosisMemorySession(name=sample)``,
  streamed.

The grader gives 1.0 to a sample whose last message is the policy's answer.
"""

from __future__ import annotations

from typing import Any

from agents import Runner

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    ConcurrencyConfig,
    Grader,
    GraderContext,
    get_rollout_context,
)
from rollout_sdk.integrations.agents import openai_agents, strands
from rollout_sdk.integrations.openai_client import ROLLOUT_MODEL_NAME, rollout_client

config = AgentWorkflowConfig(name="id-headers", concurrency=ConcurrencyConfig(max_concurrent=32))


async def through_openai(ctx: AgentWorkflowContext[Any], sample: str) -> list[dict[str, Any]]:
    rollout = get_rollout_context()
    assert rollout is not None
    client = rollout_client(rollout, sample_id=sample)
    messages = [dict(message) for message in ctx.prompt]
    answer = await client.chat.completions.create(model=ROLLOUT_MODEL_NAME, messages=messages)  # type: ignore[arg-type]
    return [*messages, answer.choices[0].message.model_dump(exclude_none=True)]


async def through_strands(ctx: AgentWorkflowContext[Any], sample: str) -> None:
    agent = strands.OsmosisStrandsAgent(
        name=sample,
        model=strands.OsmosisRolloutModel(params={"max_tokens": 64}),
        messages=ctx.prompt,
        callback_handler=None,
    )
    await agent.invoke_async()


async def through_openai_agents(ctx: AgentWorkflowContext[Any], sample: str) -> None:
    agent = openai_agents.OsmosisAgent(
        name="answerer", instructions="Answer.", model=openai_agents.OsmosisRolloutModel()
    )
    await Runner.run(agent, ctx.prompt, session=openai_agents.OsmosisMemorySession(name=sample))


PATHS = {
    "openai": through_openai,
    "strands": through_strands,
    "openai_agents": through_openai_agents,
}


class IdHeadersWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> Any:
        metadata = ctx.metadata or {}
        return await PATHS[metadata["path"]](ctx, metadata["sample"])


class AnsweredGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.set_reward(1.0 if ctx.sample.messages[-1].get("role") == "assistant" else 0.0)
