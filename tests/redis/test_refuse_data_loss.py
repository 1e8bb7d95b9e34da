"""A Redis that can lose admitted rollouts is refused by every gateway and worker at
start (an eviction policy other than ``noeviction``; no persistence), with a message naming the
fix, unless ``ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS`` says to run anyway. Before, a fleet ran on
``volatile-lru`` and lost rollouts whose records were evicted while their messages survived."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rollout_fleet.local import fleet_command
from rollout_fleet.processes import ManagedProcess, free_port, port_open, wait_until
from rollout_fleet.redis_server import RedisServer
from tests.harness import SCRIPTED_AGENT

RISKY = {
    "volatile-lru": (True, "volatile-lru"),
    "allkeys-lru": (True, "allkeys-lru"),
    "no persistence": (False, "persistence is off"),
}


@pytest.fixture(params=sorted(RISKY))
def risky_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    aof, says = RISKY[request.param]
    server = RedisServer(appendonly=aof, data_dir=tmp_path / "redis").start()
    client = redis.Redis.from_url(server.url)
    if aof:
        client.config_set("maxmemory-policy", request.param)
    client.close()
    yield server.url, says
    server.stop()


def start(command: str, url: str, log: Path, **extra: str) -> tuple[ManagedProcess, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_FLEET_")}
    env |= {"REDIS_URL": url, "AGENT": SCRIPTED_AGENT, "PYTHONUNBUFFERED": "1", **extra}
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port)] if command == "gateway" else []
    return ManagedProcess(command, fleet_command(command, *args), env, log).start(), port


@pytest.mark.parametrize("command", ["gateway", "worker"])
def test_a_process_refuses_a_redis_that_loses_rollouts(
    risky_redis: tuple[str, str], command: str, tmp_path: Path
) -> None:
    url, says = risky_redis
    process, _ = start(command, url, tmp_path / f"{command}.log")
    try:
        wait_until(lambda: not process.alive(), 60, f"the {command} to refuse")
        output = process.output()
        assert says in output
        assert "ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS" in output
    finally:
        process.stop()


def test_the_data_loss_override_runs_anyway(risky_redis: tuple[str, str], tmp_path: Path) -> None:
    url, says = risky_redis
    process, port = start(
        "gateway", url, tmp_path / "gateway.log", ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS="true"
    )
    try:
        wait_until(lambda: port_open(port), 60, "the gateway")
        assert process.alive()
        assert says in process.output()  # the warning, loud
    finally:
        process.stop()
