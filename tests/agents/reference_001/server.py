# The quick-start snippet of shared/reference/001_50f9b5c86b47165d.txt. The snippet has
# no import lines; the block below supplies them. Everything after the marker is verbatim.
from osmosis_ai.rollout import (
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
    create_app,
)
from rewards import compute_reward
from tools import CALCULATOR_TOOL_SCHEMAS, execute_tools

# --- verbatim from here ---
class CalculatorAgentLoop(RolloutAgentLoop):
    name = "calculator"

    def get_tools(self, request: RolloutRequest):
        return CALCULATOR_TOOL_SCHEMAS

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _turn in range(ctx.request.max_turns):
            result = await ctx.chat(messages, **ctx.request.completion_params)
            messages.append(result.message)
            if not result.has_tool_calls:
                break
            tool_results = await execute_tools(result.tool_calls)
            messages.extend(tool_results)
        return ctx.complete(messages, reward=compute_reward(...))

agent_loop = CalculatorAgentLoop()
app = create_app(agent_loop)
