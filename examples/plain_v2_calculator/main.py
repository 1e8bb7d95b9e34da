"""A v2 workflow without an agent framework: the SDK's OpenAI client, two tools, a grader.

The workflow calls the policy itself through ``rollout_client``, an ``openai.AsyncOpenAI``
already pointed at this rollout's TrainGate (base URL, key, ``x-rollout-id``/``x-sample-id``
headers), runs the tool calls the model asks for, and returns the conversation: that list is
the rollout's sample. The grader compares the ``#### <number>`` answer with the label.

Check it:               rollout-sdk validate -m examples/plain_v2_calculator/main.py
Run it on the fleet:    rollout-fleet up --agent examples/plain_v2_calculator/main.py
(``rollout_client`` needs the ``openai`` package; both framework extras bring it.)
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    ConcurrencyConfig,
    Grader,
    GraderContext,
    get_rollout_context,
)
from rollout_sdk.integrations.openai_client import ROLLOUT_MODEL_NAME, rollout_client

ANSWER = re.compile(r"####\s*(-?\d+(?:\.\d+)?)")


def _tool(name: str, description: str) -> dict[str, Any]:
    number = {"type": "number"}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"a": number, "b": number},
                "required": ["a", "b"],
            },
        },
    }


TOOLS = [
    _tool("add", "Add two numbers (subtract by adding a negative number)."),
    _tool("multiply", "Multiply two numbers (divide by multiplying by a reciprocal)."),
]
OPERATIONS = {"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}


def run_tool(name: str, arguments: str) -> str:
    """The tool's answer as text; a bad call becomes an error the model can read."""
    try:
        args = json.loads(arguments)
        value = OPERATIONS[name](float(args["a"]), float(args["b"]))
    except (KeyError, TypeError, ValueError) as exc:
        return f"Error: {exc!r}"
    return str(int(value)) if float(value).is_integer() else str(round(value, 6))


class CalculatorConfig(AgentWorkflowConfig):
    name: str = "plain-calculator"
    max_turns: int = 6
    temperature: float = 1.0
    max_tokens: int = 512


config = CalculatorConfig(concurrency=ConcurrencyConfig(max_concurrent=64))


class CalculatorWorkflow(AgentWorkflow[CalculatorConfig]):
    async def run(self, ctx: AgentWorkflowContext[CalculatorConfig]) -> list[dict[str, Any]]:
        settings = ctx.config or CalculatorConfig()
        rollout = get_rollout_context()  # set by whatever runs the workflow
        if rollout is None:
            raise RuntimeError("run this workflow through a backend, the CLI or the fleet")
        client = rollout_client(rollout, sample_id="calculator")
        messages: list[dict[str, Any]] = [dict(message) for message in ctx.prompt]
        for _ in range(settings.max_turns):
            completion = await client.chat.completions.create(
                model=ROLLOUT_MODEL_NAME,  # a placeholder: the TrainGate serves its policy
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                temperature=settings.temperature,
                max_tokens=settings.max_tokens,
            )
            reply = completion.choices[0].message
            messages.append(reply.model_dump(exclude_none=True))
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                if call.type != "function":
                    continue
                answer = run_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
        return messages  # the sample: graded, then returned to the trainer


def final_answer(messages: Any) -> str | None:
    """The ``#### n`` answer in the last assistant message (plain chat messages)."""
    for message in reversed(list(messages)):
        if message.get("role") == "assistant":
            match = ANSWER.search(message.get("content") or "")
            return match.group(1) if match else None
    return None


class ExactAnswerGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None  # the workflow returned its messages
        answer = final_answer(ctx.sample.messages)
        ctx.set_reward(1.0 if answer is not None and answer == (ctx.label or "").strip() else 0.0)
