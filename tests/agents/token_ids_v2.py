"""A v2 workflow for the token-id trajectory tests, on the real Strands and OpenAI Agents
packages. ``metadata["framework"]`` picks ``"strands"`` or ``"openai_agents"``,
``metadata["stream"]`` whether its model streams; every rollout has two samples, ``first``
and ``second``: one agent each (Strands: its name; OpenAI Agents: its session's), each
solving the prompt with the ``multiply`` tool the calculator mock asks for."""

from __future__ import annotations

from typing import Any

from agents import ModelSettings, Runner, function_tool
from strands import tool

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
)
from rollout_sdk.integrations.agents import openai_agents, strands

SAMPLES = ("first", "second")
MAX_ROUNDS = 4


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@function_tool(name_override="multiply")
def multiply_tool(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


config = AgentWorkflowConfig(name="token-ids")


async def strands_sample(name: str, prompt: Any, stream: bool) -> None:
    agent = strands.OsmosisStrandsAgent(
        name=name,
        model=strands.OsmosisRolloutModel(stream=stream, params={"temperature": 1.0}),
        tools=[multiply],
        messages=prompt,
        callback_handler=None,
    )
    for _ in range(MAX_ROUNDS):
        result = await agent.invoke_async()
        if not any("toolUse" in block for block in result.message.get("content", [])):
            return


async def openai_agents_sample(name: str, prompt: Any, stream: bool) -> None:
    agent = openai_agents.OsmosisAgent(
        name=name,
        instructions="Use the multiply tool, then answer as #### <number>.",
        model=openai_agents.OsmosisRolloutModel(stream=stream),
        model_settings=ModelSettings(temperature=1.0),
        tools=[multiply_tool],
    )
    session = openai_agents.OsmosisMemorySession(name=name)
    await Runner.run(agent, prompt, session=session, max_turns=MAX_ROUNDS)


class TokenIdsWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> None:
        metadata = ctx.metadata or {}
        stream = bool(metadata.get("stream", True))
        run_sample = (
            openai_agents_sample if metadata.get("framework") == "openai_agents" else strands_sample
        )
        for name in SAMPLES:
            await run_sample(name, ctx.prompt, stream)


class EverySampleGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        for sample_id in ctx.samples:
            ctx.set_sample_reward(sample_id, 1.0)
        ctx.set_reward(1.0)
