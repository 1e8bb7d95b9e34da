"""Agent-framework integrations: Strands Agents and the OpenAI Agents SDK."""
