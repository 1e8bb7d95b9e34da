"""What sandboxed rollouts leave on the engine: the labels the fleet puts on each sandbox, and
a wait for nothing labelled to be left; the host's address, as sandboxes reach it; and
rollouts sent to a fleet ``rollout-fleet up`` runs, awaited until each has left nothing."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx

from rollout_fleet.processes import free_port, wait_until
from tests.harness import LEASE_HEADER, v2_body

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


def succeeded_rollouts(
    engine: docker.DockerClient,
    gateway: httpx.Client,
    trainer_url: str,
    labels: list[str],
    timeout: float,
    logs: Callable[[], str],
) -> list[dict[str, Any]]:
    """One rollout per label (the calculator's question, 6 * 7) through ``gateway``; each
    result, once it succeeded and its sandbox is gone (``logs`` explains a failure)."""
    admitted = []
    for label in labels:
        body = v2_body(trainer_url, label=label)
        response = gateway.post("/rollout", json=body)
        assert response.status_code == 202, response.text
        admitted.append((body["rollout_id"], response.json()["polling_lease_token"]))
    results = []
    for rollout_id, token in admitted:
        deadline = time.monotonic() + timeout
        result: dict[str, Any] = {"status": "queued"}
        while result["status"] not in ("success", "failure", "cancelled"):
            assert time.monotonic() < deadline, logs()[-5000:]
            time.sleep(0.2)
            result = gateway.get(
                f"/rollout/{rollout_id}/result", headers={LEASE_HEADER: token}
            ).json()
        assert result["status"] == "success", (result, logs()[-5000:])
        none_left(engine, f"{ROLLOUT_LABEL}={rollout_id}", within=5)
        results.append({"rollout_id": rollout_id, **result})
    return results


@contextlib.contextmanager
def fleet_up(
    python: str, main: Path, env: dict[str, str], folder: Path, start_within: float
) -> Iterator[tuple[httpx.Client, Path]]:
    """``rollout-fleet up`` on ``main`` with one worker, run by ``python`` in ``folder``: its
    gateway and its output's file. Stopped with Ctrl-C when the block ends, which must make
    it exit 0 (killed instead when the block failed)."""
    port = free_port()
    log_path = folder / "up.log"
    argv = [python, "-m", "rollout_fleet", "up", "--agent", str(main)]
    argv += ["--workers", "1", "--no-flower", "--port", str(port)]
    with log_path.open("w") as log:
        up = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            started = lambda: "Press Ctrl-C to stop." in log_path.read_text()  # noqa: E731
            wait_until(lambda: started() or up.poll() is not None, start_within, "up")
            assert started(), log_path.read_text()[-3000:]
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as gateway:
                yield gateway, log_path
            up.send_signal(signal.SIGINT)
            assert up.wait(60) == 0, log_path.read_text()[-3000:]
        finally:
            if up.poll() is None:
                up.kill()
