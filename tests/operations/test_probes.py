"""Deployment: the compose healthchecks mean something. ``probe gateway``
passes only while the gateway's Redis answers; ``probe worker`` only while the worker is
consuming (its liveness file goes stale when the broker goes away and is fresh again once
it is back); a worker that stops withdraws from ``/ready`` at once."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.processes import wait_until
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV
from tests.harness import SCRIPTED_AGENT

MAX_AGE = "4"  # seconds; the worker touches its file every lease/3 = 1 s here


def probe(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fleet_command("probe", *args), env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def alive_file(tmp_path: Path) -> Path:
    return tmp_path / "worker.alive"


@pytest.fixture
def fleet(tmp_path: Path, alive_file: Path) -> Iterator[tuple[LocalFleet, RedisServer]]:
    redis_server = RedisServer(data_dir=tmp_path / "redis").start()
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=redis_server.url,
        workers=1,
        env={**TEST_ENV, "ROLLOUT_FLEET_WORKER_ALIVE_FILE": str(alive_file)},
        log_dir=tmp_path / "logs",
    )
    try:
        fleet.start()
        yield fleet, redis_server
    finally:
        fleet.stop()
        redis_server.stop()


def test_probes_follow_redis_away_and_back(
    fleet: tuple[LocalFleet, RedisServer], alive_file: Path
) -> None:
    local, redis_server = fleet
    env = local.process_env()
    gateway = ("gateway", "--port", str(local.gateway_port))
    worker = ("worker", "--max-age", MAX_AGE)
    wait_until(lambda: probe(*worker, env=env).returncode == 0, 30, "a consuming worker")
    assert probe(*gateway, env=env).returncode == 0

    redis_server.stop()
    ready = httpx.get(f"{local.gateway_url}/ready", timeout=10)
    assert ready.status_code == 503
    assert ready.json()["ready"] is False
    assert ready.json()["redis"].startswith("unavailable (")
    failed = probe(*gateway, env=env)
    assert failed.returncode == 1
    assert "gateway not ready: redis unavailable" in failed.stdout
    wait_until(lambda: probe(*worker, env=env).returncode == 1, 30, "the worker to look stalled")
    assert "worker stalled" in probe(*worker, env=env).stdout

    redis_server.start()
    wait_until(lambda: probe(*gateway, env=env).returncode == 0, 30, "the gateway back")
    wait_until(lambda: probe(*worker, env=env).returncode == 0, 90, "the worker consuming again")
    assert time.time() - alive_file.stat().st_mtime < float(MAX_AGE)
    wait_until(lambda: local.readiness().workers == 1, 30, "the worker's heartbeat again")

    local.processes["worker-1"].stop()  # a stopping worker withdraws at once
    assert not alive_file.exists()
    assert local.readiness().workers == 0


def test_probe_worker_without_a_worker_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "ROLLOUT_FLEET_WORKER_ALIVE_FILE": str(tmp_path / "none")}
    result = probe("worker", env=env)
    assert result.returncode == 1
    assert "worker not consuming yet" in result.stdout


def test_probe_gateway_without_a_gateway_says_so() -> None:
    result = probe("gateway", "--port", "9", env=dict(os.environ))
    assert result.returncode == 1
    assert "unreachable" in result.stdout
