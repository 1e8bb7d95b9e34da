"""A process-wide, thread-safe registry of agent loops by name (SDK.md §1.12)."""

from __future__ import annotations

import threading

from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.core.exceptions import AgentLoopNotFoundError


class AgentLoopRegistry:
    def __init__(self) -> None:
        self._loops: dict[str, RolloutAgentLoop] = {}
        self._lock = threading.Lock()

    def register(self, agent_loop: RolloutAgentLoop) -> None:
        with self._lock:
            if agent_loop.name in self._loops:
                raise ValueError(f"Agent loop '{agent_loop.name}' is already registered")
            self._loops[agent_loop.name] = agent_loop

    def unregister(self, name: str) -> bool:
        with self._lock:
            return self._loops.pop(name, None) is not None

    def get(self, name: str) -> RolloutAgentLoop | None:
        with self._lock:
            return self._loops.get(name)

    def list_names(self) -> list[str]:
        with self._lock:
            return sorted(self._loops)

    def clear(self) -> None:
        with self._lock:
            self._loops.clear()


_registry = AgentLoopRegistry()


def register_agent_loop(agent_loop: RolloutAgentLoop) -> None:
    _registry.register(agent_loop)


def unregister_agent_loop(name: str) -> bool:
    return _registry.unregister(name)


def get_agent_loop(name: str) -> RolloutAgentLoop:
    agent_loop = _registry.get(name)
    if agent_loop is None:
        raise AgentLoopNotFoundError(name, _registry.list_names())
    return agent_loop


def list_agent_loops() -> list[str]:
    return _registry.list_names()


__all__ = [
    "AgentLoopRegistry",
    "get_agent_loop",
    "list_agent_loops",
    "register_agent_loop",
    "unregister_agent_loop",
]
