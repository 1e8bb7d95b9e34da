"""A v1 calculator agent: the model calls add/multiply until it can answer ``#### <n>``.

Run it on the fleet:   rollout-fleet up --agent examples/calculator/server.py:agent_loop
or in one process:     rollout-sdk serve -m server:agent_loop --local   (from this folder)
"""

from __future__ import annotations

import time

from rewards import compute_reward
from tools import CALCULATOR_TOOL_SCHEMAS, execute_tool

from rollout_sdk import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from rollout_sdk.tools import execute_tool_calls


def last_assistant_text(messages: list[dict]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant" and isinstance(message.get("content"), str):
            return message["content"]
    return ""


class CalculatorAgentLoop(RolloutAgentLoop):
    name = "calculator"

    def get_tools(self, request: RolloutRequest) -> list:
        return CALCULATOR_TOOL_SCHEMAS

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        finish_reason = "max_turns"
        for turn in range(ctx.request.max_turns):
            ctx.log_event("pre_llm", turn=turn, num_messages=len(messages))
            result = await ctx.chat(messages, **ctx.request.completion_params)
            messages.append(result.message)
            if not result.has_tool_calls:
                finish_reason = result.finish_reason
                break
            started = time.monotonic()
            messages.extend(await execute_tool_calls(result.tool_calls, execute_tool))
            elapsed_ms = (time.monotonic() - started) * 1000
            for _ in result.tool_calls:
                ctx.record_tool_call(latency_ms=elapsed_ms / len(result.tool_calls))
        ground_truth = ctx.request.metadata.get("ground_truth")
        reward = None
        if ground_truth is not None:
            reward = compute_reward(last_assistant_text(messages), str(ground_truth))
        ctx.log_event("rollout_complete", finish_reason=finish_reason, reward=reward)
        return ctx.complete(messages, finish_reason=finish_reason, reward=reward)


agent_loop = CalculatorAgentLoop()
