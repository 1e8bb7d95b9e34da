"""The Strands multiply workflow (examples/strands_multiply/main.py), written against the
upstream ``osmosis_ai`` names: a ``multiply`` tool, two LLM turns against the mock
TrainGate's "calculator" responder, graded against the label.

It imports only module paths that exist both in upstream ``osmosis-ai`` 0.3.8 and in our
``osmosis_ai`` alias, so the same file runs natively on upstream's ``LocalBackend`` +
``create_rollout_server`` (bench/upstream_server.py, in upstream's own venv) and on our
fleet or in-process server (``rollout_sdk.loader.load_agent``). Upstream's
``OsmosisStrandsAgent`` binds the placeholder model to strands' ``LiteLLMModel``, ours to
strands' ``OpenAIModel``; ``params`` is a model-config key of both.
"""

from __future__ import annotations

import re
from typing import Any

# osmosis_ai is our SDK's import alias at run time (or upstream's package in its own venv),
# neither of which mypy can see: its names are Any here.
# mypy: allow-subclassing-any
from osmosis_ai.rollout import (  # type: ignore[import-not-found]
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    ConcurrencyConfig,
    Grader,
    GraderContext,
)
from osmosis_ai.rollout.integrations.agents.strands import (  # type: ignore[import-not-found]
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)
from strands import tool

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
