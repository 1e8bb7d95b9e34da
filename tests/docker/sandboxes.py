"""What sandboxed rollouts leave on the engine: the labels the fleet puts on each sandbox, and
a wait for nothing labelled to be left; and the host's address, as sandboxes reach it."""

from __future__ import annotations

import socket
import time

import docker

FLEET_LABEL = "org.rollout-fleet.fleet"


ROLLOUT_LABEL = "org.rollout-fleet.rollout"


def labelled(engine: docker.DockerClient, label: str) -> dict[str, list[str]]:
    """Names of the containers, networks and volumes with ``label`` (``k=v``)."""
    filters = {"label": label}
    return {
        "containers": [c.name for c in engine.containers.list(all=True, filters=filters)],
        "networks": [n.name for n in engine.networks.list(filters=filters)],
        "volumes": [v.name for v in engine.volumes.list(filters=filters)],
    }


def none_left(engine: docker.DockerClient, label: str, within: float) -> float:
    """Seconds until nothing carries ``label``; fails after ``within``."""
    started = time.monotonic()
    while True:
        found = labelled(engine, label)
        if not any(found.values()):
            return time.monotonic() - started
        if time.monotonic() - started > within:
            raise AssertionError(f"left behind after {within}s: {found}")
        time.sleep(0.5)


def host_address() -> str:
    """This host's address on its default route: how sandboxes reach it (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # UDP: nothing is sent
        return str(probe.getsockname()[0])
