"""``osmosis_ai.rollout.integrations.agents``: import ``strands`` or ``openai_agents``."""
