"""What every request handler needs, built once per gateway process (``app.state.gateway``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from celery import Celery
from fastapi import Depends, Request

from rollout_core.durability import RedisWatch
from rollout_core.secrets import SecretBox
from rollout_core.settings import FleetSettings
from rollout_core.store import RecordStore
from rollout_gateway.headroom import Headroom
from rollout_gateway.tools import ToolsRunner
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import Agent


@dataclass(frozen=True)
class Gateway:
    """What a request handler needs; built once per gateway process."""

    settings: FleetSettings
    celery: Celery
    agent: Agent
    store: RecordStore
    box: SecretBox
    tools: ToolsRunner
    watch: RedisWatch
    headroom: Headroom  # room in Redis for admitted rollouts to end

    @property
    def speaks_v1(self) -> bool:
        return isinstance(self.agent, RolloutAgentLoop)

    def agent_loop(self) -> RolloutAgentLoop:
        """The v1 agent (only a v1 gateway asks)."""
        if not isinstance(self.agent, RolloutAgentLoop):
            raise TypeError(f"{self.agent.name} is a v2 workflow, not a v1 agent loop")
        return self.agent


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(_gateway)]


__all__ = ["Gateway", "GatewayDep"]
