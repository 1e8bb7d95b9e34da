"""A v2 workflow on the OpenAI Agents SDK: multiply with a tool, graded against the label.

Run it on the fleet:     rollout-fleet up --agent examples/openai_agents_multiply/main.py
or in one process:       python examples/openai_agents_multiply/main.py
                         (needs rollout-sdk[openai-agents])
"""

from __future__ import annotations

import os
import re
from typing import Any

from agents import ModelSettings, Runner, function_tool

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    ConcurrencyConfig,
    Grader,
    GraderContext,
)
from rollout_sdk.integrations.agents.openai_agents import (
    OsmosisAgent,
    OsmosisMemorySession,
    OsmosisRolloutModel,
)

ANSWER = re.compile(r"####\s*(-?\d+(?:\.\d+)?)")


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


config = AgentWorkflowConfig(
    name="openai-agents-multiply", concurrency=ConcurrencyConfig(max_concurrent=64)
)


class MultiplyWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> None:
        agent = OsmosisAgent(
            name="multiplier",
            instructions="Use the multiply tool, then answer as #### <number>.",
            model=OsmosisRolloutModel(),
            model_settings=ModelSettings(temperature=1.0, max_tokens=512),
            tools=[multiply],
        )
        await Runner.run(agent, ctx.prompt, session=OsmosisMemorySession(name="multiplier"))


def final_answer(items: Any) -> str | None:
    """The ``#### n`` answer in the last assistant message (Responses-API items)."""
    for item in reversed(list(items)):
        if item.get("role") == "assistant":
            text = "".join(part.get("text", "") for part in item.get("content", []))
            match = ANSWER.search(text)
            return match.group(1) if match else None
    return None


class ExactAnswerGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        answer = final_answer(ctx.sample.messages)
        ctx.set_reward(1.0 if answer is not None and answer == (ctx.label or "").strip() else 0.0)


if __name__ == "__main__":
    import uvicorn

    from rollout_sdk import LocalBackend, create_rollout_server

    backend = LocalBackend(
        workflow=MultiplyWorkflow, workflow_config=config, grader=ExactAnswerGrader
    )
    port = int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000"))
    uvicorn.run(create_rollout_server(backend=backend), host="0.0.0.0", port=port)
