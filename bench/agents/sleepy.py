"""A v2 agent that takes a minute and calls no LLM: its rollouts stay in flight (or queued),
so their result long-polls wait."""

import asyncio

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
)


class Sleepy(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        await asyncio.sleep(60)
        return AgentWorkflowOutput(messages=list(ctx.prompt))


config = AgentWorkflowConfig(name="sleepy")
