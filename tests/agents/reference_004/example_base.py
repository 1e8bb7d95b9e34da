# Code block 0 of shared/reference/004_c0db105f2916056e.txt.
# Copied byte for byte (a test checks it against the document).
# --- verbatim from here ---
from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext


class MyWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        # Build and run your agent here.
        pass
