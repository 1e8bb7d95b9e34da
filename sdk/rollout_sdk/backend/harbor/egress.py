"""Where a sandbox may connect: the TrainGate, through a relay, and nowhere else.

A trial's Compose network (``default``: the task's services and ``main``) is made
``internal``: no route leaves it, so neither Redis, the gateway, this host nor a cloud
metadata address can be reached from it. When the agent talks to the model from inside the
sandbox, a relay container (``relay.py``) joins that network under the TrainGate's host name
and a second network with a way out, and forwards that one host and port. The agent's URL
keeps its host name (TLS keeps working); a TrainGate named by an IP address is reached as
``traingate`` instead.

``open`` egress (``ROLLOUT_FLEET_SANDBOX_EGRESS=open``) leaves the network as Harbor makes it,
for tasks whose tests fetch from the internet.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import socket
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rollout_sdk.backend.harbor.engine import DockerEngine

RELAY_BASE = "python:3.12-slim-bookworm"
RELAY_SERVICE = "rollout-egress"
IP_ALIAS = "traingate"


class Egress(StrEnum):
    TRAINGATE = "traingate"
    OPEN = "open"


class RefusedRoute(ValueError):
    """The TrainGate's host resolves to an address no sandbox may reach."""


@dataclass(frozen=True)
class Route:
    """The relay for one TrainGate URL, and that URL as the sandbox sees it. ``host`` is
    what the relay connects to: after :func:`checked`, an address, not a name."""

    host: str
    port: int
    alias: str
    url: str  # the chat URL the sandbox uses

    @classmethod
    def to(cls, url: str) -> Route:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return cls(host, port, host, url)
        netloc = f"{IP_ALIAS}:{port}"
        if parts.username or parts.password:
            netloc = f"{parts.netloc.rsplit('@', 1)[0]}@{netloc}"
        return cls(host, port, IP_ALIAS, urlunsplit(parts._replace(netloc=netloc)))


async def checked(route: Route) -> Route:
    """``route`` with its host resolved here and checked as the SDK's clients check every
    address they connect to (rollout_sdk/client/destinations.py: never link-local or cloud
    metadata, nor an operator's refused networks; and, for a sandbox, never this host's
    loopback). The relay connects to that address, so a name that resolves elsewhere later
    (DNS rebinding) never takes the sandbox anywhere else."""
    from rollout_sdk.client.destinations import host_address, refused_address, refused_host
    from rollout_sdk.config import get_settings

    networks = get_settings().client.refused_networks
    why = refused_host(route.host, networks)
    if why is not None:
        raise RefusedRoute(f"the TrainGate host {route.host} {why}")
    literal = host_address(route.host)
    if literal is not None:
        addresses = [literal]
    else:
        loop = asyncio.get_running_loop()
        try:
            found = await loop.getaddrinfo(route.host, route.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise RefusedRoute(f"the TrainGate host {route.host} does not resolve: {exc}") from None
        addresses = [ipaddress.ip_address(entry[4][0]) for entry in found]
    for address in addresses:
        refused = refused_address(address, networks)
        if refused is None and address.is_loopback:
            refused = f"loopback address {address}, which no sandbox reaches"
        if refused is not None:
            raise RefusedRoute(f"the TrainGate host {route.host} resolves to a {refused}")
    chosen = sorted(addresses, key=lambda a: a.version)[0]  # IPv4 first: the relay's way out
    return Route(str(chosen), route.port, route.alias, route.url)


def relay_image() -> str:
    source = (Path(__file__).parent / "relay.py").read_bytes()
    digest = hashlib.sha256(RELAY_BASE.encode() + b"\0" + source).hexdigest()[:16]
    return f"rollout-fleet-sandbox-relay:{digest}"


async def build_relay(engine: DockerEngine) -> str:
    """The relay's image (``RELAY_BASE`` plus ``relay.py``), built once per engine, with no
    network (it only copies a file)."""
    image = relay_image()
    if await engine.image_exists(image):
        return image
    with tempfile.TemporaryDirectory(prefix="rollout-sandbox-relay-") as folder:
        context = Path(folder)
        (context / "relay.py").write_bytes((Path(__file__).parent / "relay.py").read_bytes())
        (context / "Dockerfile").write_text(f"FROM {RELAY_BASE}\nCOPY relay.py /relay.py\n")
        await engine.build(context, image, network="none", labels={})
    return image


def overlay(labels: dict[str, str], route: Route | None, image: str | None) -> dict[str, Any]:
    """The Compose overlay that closes the trial's network and, with ``route``, opens the
    one way to the TrainGate."""
    services: dict[str, Any] = {}
    # internal: no route out. No IPv4 address on the host's side of the bridge either: an
    # internal bridge still reaches the host through its own address (seen on Docker 28).
    closed = {"com.docker.network.bridge.inhibit_ipv4": "true"}
    networks: dict[str, Any] = {
        "default": {"internal": True, "driver_opts": closed, "labels": labels}
    }
    if route is not None and image is not None:
        services[RELAY_SERVICE] = {
            "image": image,
            "command": ["python3", "/relay.py", str(route.port), route.host, str(route.port)],
            "init": True,
            "labels": labels,
            "stop_grace_period": "1s",
            "networks": {"default": {"aliases": [route.alias]}, "egress": {}},
        }
        networks["egress"] = {"labels": labels}
    return {"services": services, "networks": networks}


__all__ = [
    "RELAY_SERVICE",
    "Egress",
    "RefusedRoute",
    "Route",
    "build_relay",
    "checked",
    "overlay",
    "relay_image",
]
