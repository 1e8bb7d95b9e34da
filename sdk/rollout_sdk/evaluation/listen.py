"""Where an evaluation's model bridges listen: an address every rollout of the run reaches.

Loopback, unless the agent's rollouts call the model from inside sandboxes, which cannot reach
this host's loopback. A backend says so the way upstream's Harbor backend does, in its
``health()``: ``chat_endpoint = {"environment": ..., "requires_public_url": True}`` (ours: a
``HarborBackend`` whose agent calls the model). Then the bridge listens on this host's address
on its default route, where a local engine's containers reach this host, and on no other
address. ``[fleet] bridge_host`` (``--bridge-host``) names another address; a loopback one is
refused for such an agent. Whoever else reaches that address reaches the bridge too, which is
why an evaluation's bridge takes only calls that carry its run's key (``LLMBridge(key=...)``).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.client.destinations import loopback_host

LOOPBACK = "127.0.0.1"
# Any address off this host does: a UDP socket's connect sends nothing, and says which of this
# host's addresses the route to it leaves from (192.0.2.1: TEST-NET-1, routed by the default).
ROUTE_PROBE = ("192.0.2.1", 9)


class BridgeHostError(Exception):
    """The bridge has no address the rollouts reach; the message says what to do."""


@dataclass(frozen=True)
class Listening:
    host: str
    why: str | None  # why not loopback, for the run to say (None: loopback, nothing to say)


def sandbox_of(agent: object) -> str | None:
    """The kind of sandbox (``"docker"``) whose rollouts call the model from inside it and so
    cannot reach this host's loopback; ``None`` for an agent that runs here."""
    if not isinstance(agent, ExecutionBackend):
        return None
    endpoint = agent.health().get("chat_endpoint")
    if not isinstance(endpoint, Mapping) or endpoint.get("requires_public_url") is not True:
        return None
    environment = endpoint.get("environment")
    return environment.strip() if isinstance(environment, str) and environment.strip() else "remote"


def default_route_address() -> str:
    """This host's IPv4 address on its default route (``OSError`` without one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(ROUTE_PROBE)
        return str(probe.getsockname()[0])


def bridge_address(agent: object, configured: str | None) -> Listening:
    """Where the run's bridges listen, given the agent and ``[fleet] bridge_host``."""
    sandbox = sandbox_of(agent)
    if configured is not None:
        if sandbox is not None and loopback_host(configured):
            raise BridgeHostError(
                f"bridge_host {configured} is this host's loopback, which the agent's {sandbox} "
                "sandboxes cannot reach: leave bridge_host out (the bridge then listens on this "
                "host's address on its default route) or give an address their containers reach"
            )
        return Listening(configured, None if loopback_host(configured) else "bridge_host")
    if sandbox is None:
        return Listening(LOOPBACK, None)
    try:
        host = default_route_address()
    except OSError as exc:
        raise BridgeHostError(
            f"the agent's {sandbox} sandboxes cannot reach this host's loopback, and this host "
            f"has no default route to find an address they reach ({exc.strerror or exc}): "
            "set [fleet] bridge_host or --bridge-host to one"
        ) from None
    return Listening(
        host,
        f"this host's address on its default route: the agent's {sandbox} sandboxes cannot "
        "reach loopback",
    )


__all__ = [
    "LOOPBACK",
    "BridgeHostError",
    "Listening",
    "bridge_address",
    "default_route_address",
    "sandbox_of",
]
