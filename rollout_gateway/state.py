"""What every request handler needs, built once per gateway process (``app.state.gateway``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated

from celery import Celery
from fastapi import Depends, Header, Request

from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import Agent
from rollout_worker.records import RecordStore
from rollout_worker.secrets import SecretBox
from rollout_worker.settings import FleetSettings


@dataclass(frozen=True)
class Gateway:
    """What a request handler needs; built once per gateway process."""

    settings: FleetSettings
    celery: Celery
    agent: Agent
    store: RecordStore
    box: SecretBox
    tools_pool: ThreadPoolExecutor

    @property
    def agent_loop(self) -> RolloutAgentLoop:
        """The v1 agent (only v1 routes ask, and only a v1 gateway mounts them)."""
        assert isinstance(self.agent, RolloutAgentLoop)
        return self.agent

    @property
    def api_key(self) -> str | None:
        key = self.settings.api_key
        return key.get_secret_value() if key is not None else None


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(_gateway)]
AuthorizationHeader = Annotated[str | None, Header()]


__all__ = ["AuthorizationHeader", "Gateway", "GatewayDep"]
