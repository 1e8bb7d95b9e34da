"""A CPU-bound v2 agent: each rollout computes for ~20 ms on its event loop, no LLM call."""

import time

from bench.agents.noop import FullMarks
from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
)

WORK_SECONDS = 0.02


class Busy(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        deadline = time.thread_time() + WORK_SECONDS
        while time.thread_time() < deadline:
            pass
        return AgentWorkflowOutput(messages=list(ctx.prompt))


config = AgentWorkflowConfig(name="busy")
__all__ = ["Busy", "FullMarks", "config"]
