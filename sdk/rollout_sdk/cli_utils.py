"""``osmosis_ai.rollout.cli_utils``: load a v1 agent loop from a ``module:attr`` reference,
failing with :class:`CLIError` as upstream's command-line helpers do.

The loading itself is :func:`rollout_sdk.loader.load_agent_loop`'s.
"""

from __future__ import annotations

from rollout_sdk import loader
from rollout_sdk.core.base import RolloutAgentLoop


class CLIError(Exception):
    """A command-line argument cannot be acted on (the message says why)."""


def load_agent_loop(module_path: str) -> RolloutAgentLoop:
    """The agent loop ``module.path:attribute`` names (an instance, or a subclass to
    instantiate); the working directory is importable. Raises :class:`CLIError`."""
    try:
        return loader.load_agent_loop(module_path)
    except loader.AgentLoadError as exc:
        raise CLIError(str(exc)) from exc


__all__ = ["CLIError", "load_agent_loop"]
