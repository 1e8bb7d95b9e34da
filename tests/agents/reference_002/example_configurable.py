# The custom-config example of shared/reference/002_d2a56acf379bdbc2.txt.
# The document lost its line breaks; only whitespace was restored (a test checks
# that the tokens match the document exactly).
# --- verbatim from here ---
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
)
class MyConfig(AgentWorkflowConfig):
    name: str = "my-workflow"
    max_iterations: int = 10
    temperature: float = 0.7
class ConfigurableWorkflow(AgentWorkflow[MyConfig]):
    async def run(self, ctx: AgentWorkflowContext[MyConfig]) -> None:
        max_iter = ctx.config.max_iterations if ctx.config else 10
        # ... use config values in your agent logic ...
