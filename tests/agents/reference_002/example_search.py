# The tool-using Strands example of shared/reference/002_d2a56acf379bdbc2.txt.
# The document lost its line breaks; only whitespace was restored (a test checks
# that the tokens match the document exactly).
# --- verbatim from here ---
from typing import Any
from strands import tool
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)
@tool(name="search")
def search_tool(query: str) -> str:
    """Search for information."""
    return f"results for {query}"
class SearchWorkflowConfig(AgentWorkflowConfig):
    name: str = "search-workflow"
    model: Any
    tools: Any
search_workflow_config = SearchWorkflowConfig(
    model=OsmosisRolloutModel(params={"temperature": 1.0}),
    tools=[search_tool],
)
class SearchWorkflow(AgentWorkflow[SearchWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[SearchWorkflowConfig]) -> None:
        config = ctx.config or search_workflow_config
        agent = OsmosisStrandsAgent(
            name="search-agent",
            model=config.model,
            tools=config.tools,
            messages=ctx.prompt,
            callback_handler=None,
        )
        for _ in range(8): # max iterations
            result = await agent.invoke_async()
            content = result.message.get("content", [])
            if not any("toolUse" in cb for cb in content):
                break
