"""A v2 agent that returns at once without calling the LLM: what remains is dispatch."""

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
)


class NoOp(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        return AgentWorkflowOutput(messages=list(ctx.prompt))


class FullMarks(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)


config = AgentWorkflowConfig(name="noop")
