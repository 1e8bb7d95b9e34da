"""``rollout-fleet up`` as an operator's supervisor drives it, on real
processes: SIGTERM and SIGHUP stop the fleet as Ctrl-C does; nothing it started outlives a
SIGKILL of it; busy ports are found before anything starts; and ``rollout-fleet status`` in
another terminal finds the fleet ``up`` runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rollout_fleet.processes import free_port, wait_until
from tests.operations.harness import (
    QUICK_START,
    assert_all_gone,
    clean_env,
    fleet_args,
    listening_ports,
    run_folder,
    started_up,
)


def test_a_sigkilled_up_leaves_no_process_and_no_open_port(tmp_path: Path) -> None:
    """The gateway runs two uvicorn processes: grandchildren of ``up`` go too."""
    with started_up(tmp_path, *fleet_args(), "--gateway-workers", "2") as up:
        tree = up.tree()
        ports = listening_ports(tree)
        # Redis, the gateway's supervisor and 2 workers, a worker, Flower, the trainer, the reaper
        assert len(tree) >= 8, [p.cmdline() for p in tree]
        assert len(ports) >= 5, ports  # Redis, gateway, worker metrics, Flower, trainer
        assert up.state_files()

        up.process.kill()
        up.process.wait()
        assert_all_gone(tree, ports)
        assert not up.state_files()  # the reaper removed it: no one finds a dead fleet


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"]
)
def test_sigint_sigterm_and_sighup_stop_the_fleet_and_say_so_last(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """A line per part as it comes up, then the table; after the signal, "stopped" is the
    last line, no process of the tree is left (by pid) and the logs are where ``up`` said."""
    with started_up(tmp_path, *fleet_args()) as up:
        tree = up.tree()
        ports = listening_ports(tree)
        started = up.output().split("Rollout Fleet is up", 1)[0]
        for part in ("Redis ✓ redis://", "gateway ✓ http://", "workers 1/1 ✓", "Flower ✓"):
            assert part in started, started
        assert "mock TrainGate ✓ http://" in started

        up.process.send_signal(signum)
        assert up.process.wait(60) == 0
        output = up.output()
        assert "stopping..." in output
        folder = run_folder(output)
        assert output.splitlines()[-1] == f"stopped (logs: {folder})"
        assert folder.parent == tmp_path / "tmp" / f"rollout-fleet-up-{os.getuid()}"
        assert {"gateway.log", "worker-1.log", "flower.log"} <= {p.name for p in folder.iterdir()}
        assert_all_gone(tree, ports)
        assert "killed" not in output  # stopped in order: the reaper found nothing left
        assert "Traceback" not in output
        assert not up.state_files()


def test_a_second_ctrl_c_kills_what_is_left_and_says_it_stopped(tmp_path: Path) -> None:
    with started_up(tmp_path, *fleet_args()) as up:
        tree = up.tree()
        ports = listening_ports(tree)

        up.process.send_signal(signal.SIGINT)
        wait_until(lambda: "stopping..." in up.output(), 30, "up to stop")
        up.process.send_signal(signal.SIGINT)  # workers take seconds to shut down cleanly
        assert up.process.wait(60) == 130
        output = up.output()
        assert "killing what is left..." in output
        assert output.splitlines()[-1] == f"stopped (logs: {run_folder(output)})"
        assert_all_gone(tree, ports)
        assert "Traceback" not in output
        assert not up.state_files()


def hold(port: int) -> socket.socket | None:
    """Someone else listens on ``port``: a socket to close when done, or None if someone
    already does (it is busy all the same)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def test_a_busy_port_is_found_before_anything_starts(tmp_path: Path) -> None:
    """A port asked for and busy: up stops at once, naming it, having started nothing.
    Flower's default (5555) busy: up takes a free port for it, says so, and runs."""
    busy = free_port()
    holder = hold(busy)
    try:
        args = [*fleet_args(), "--port", str(busy)]  # the last --port wins
        with started_up(tmp_path / "asked", *args, wait=False) as up:
            assert up.process.wait(30) == 2
            assert f"port {busy} (the gateway) is in use" in up.output()
            assert "Rollout Fleet is up" not in up.output()
    finally:
        if holder is not None:
            holder.close()

    args = [*QUICK_START, "--workers", "1", "--port", str(free_port())]
    args += ["--mock-trainer-port", str(free_port())]
    holder = hold(5555)
    try:
        with started_up(tmp_path / "default", *args, wait=False) as up:
            # Held until up has chosen its ports, not longer: 5555 is a well-known port.
            wait_until(lambda: "Flower listens on" in up.output(), 60, "up to choose")
            if holder is not None:
                holder.close()
            up.wait_up()
            notice = up.output().split("port 5555 is in use: Flower listens on ", 1)[1]
            flower_port = int(notice.split()[0])
            assert f"http://127.0.0.1:{flower_port}" in up.output()
            login = httpx.get(f"http://127.0.0.1:{flower_port}/api/workers", timeout=10)
            assert login.status_code == 401  # Flower itself, behind its login

            up.process.send_signal(signal.SIGINT)
            assert up.process.wait(60) == 0
    finally:
        if holder is not None:
            holder.close()


def test_status_in_another_terminal_finds_the_fleet_up_runs(tmp_path: Path) -> None:
    """The README's quick start, its sample rollout, then ``rollout-fleet status demo-1``
    from a new terminal's environment: no REDIS_URL, another working directory."""
    with started_up(tmp_path, *fleet_args(flower=False)) as up:
        printed = up.output()
        sample = json.loads(printed.split("-d '", 1)[1].split("'", 1)[0])
        gateway = printed.split("curl -s -X POST ", 1)[1].split("/v1/rollout/init", 1)[0]
        result = printed.split("Its result:\n  curl -s ", 1)[1].split()[0]
        assert httpx.post(f"{gateway}/v1/rollout/init", json=sample).status_code == 202
        wait_until(lambda: httpx.get(result).json().get("reward") == 1.0, 60, "the rollout")

        other_terminal = tmp_path / "elsewhere"
        other_terminal.mkdir()
        status = subprocess.run(
            [sys.executable, "-m", "rollout_fleet", "status", "demo-1", "--json"],
            check=False,
            cwd=other_terminal,
            env=clean_env(up.runtime_dir),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        view = json.loads(status.stdout)
        assert (view["rollout_id"], view["status"], view["reward"]) == ("demo-1", "success", 1.0)

        (state_file,) = up.state_files()
        assert state_file.stat().st_mode & 0o777 == 0o600  # a Redis URL may hold a password

        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(60) == 0
    assert not up.state_files()
