"""Protocol core: the agent-loop base classes, wire schemas and exceptions."""
