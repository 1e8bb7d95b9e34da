"""A v2 workflow on Strands Agents: multiply with a tool, graded against the label.

Run it on the fleet:     rollout-fleet up --agent examples/strands_multiply/main.py
or in one process:       python examples/strands_multiply/main.py   (needs rollout-sdk[strands])
"""

from __future__ import annotations

import os
import re
from typing import Any

from strands import tool

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    ConcurrencyConfig,
    Grader,
    GraderContext,
)
from rollout_sdk.integrations.agents.strands import OsmosisRolloutModel, OsmosisStrandsAgent

ANSWER = re.compile(r"####\s*(-?\d+(?:\.\d+)?)")


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class MultiplyConfig(AgentWorkflowConfig):
    name: str = "strands-multiply"
    model: Any = OsmosisRolloutModel(params={"temperature": 1.0, "max_tokens": 512})
    max_rounds: int = 4


config = MultiplyConfig(concurrency=ConcurrencyConfig(max_concurrent=64))


class MultiplyWorkflow(AgentWorkflow[MultiplyConfig]):
    async def run(self, ctx: AgentWorkflowContext[MultiplyConfig]) -> None:
        settings = ctx.config or MultiplyConfig()
        agent = OsmosisStrandsAgent(
            name="multiplier",
            model=settings.model,
            tools=[multiply],
            messages=ctx.prompt,
            callback_handler=None,
        )
        for _ in range(settings.max_rounds):
            result = await agent.invoke_async()
            if not any("toolUse" in block for block in result.message.get("content", [])):
                break


def final_answer(messages: Any) -> str | None:
    """The ``#### n`` answer in the last assistant message (Strands content blocks)."""
    for message in reversed(list(messages)):
        if message.get("role") == "assistant":
            text = "".join(block.get("text", "") for block in message.get("content", []))
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
