"""``rollout-fleet up`` run for real, as a terminal runs it: started in its own session,
watched until it is up, and checked to leave no process and no open port behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

from rollout_fleet.processes import free_port, port_open, wait_until
from tests.harness import REPO, quick_start_commands

QUICK_START = quick_start_commands()[0].removeprefix("uv run rollout-fleet up ").split()


GONE_SECONDS = 20.0  # how long every process of a stopped or killed `up` may take to go


@dataclass
class Up:
    """A ``rollout-fleet up`` subprocess, its output in ``log``, its state files in
    ``runtime_dir`` (``XDG_RUNTIME_DIR``: a test's own, shared with the CLI it runs)."""

    process: subprocess.Popen[bytes]
    log: Path
    runtime_dir: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_up(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while "Press Ctrl-C to stop." not in self.output():
            assert self.process.poll() is None, f"up exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"up not up in {timeout:g}s:\n{self.output()}"
            time.sleep(0.1)

    def tree(self) -> list[psutil.Process]:
        """Every process ``up`` started, and theirs (its reaper too)."""
        return psutil.Process(self.process.pid).children(recursive=True)

    def state_files(self) -> list[Path]:
        return sorted((self.runtime_dir / "rollout-fleet").glob("up-*.json"))


def clean_env(runtime_dir: Path) -> dict[str, str]:
    """A new terminal's environment: no Redis URL, no fleet settings; temporary files (up's
    log folders) in the test's own folder, next to ``runtime_dir``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "REDIS_URL" and not key.startswith("ROLLOUT_FLEET_")
    }
    temporary = runtime_dir.parent / "tmp"
    temporary.mkdir(exist_ok=True)
    return {**env, "XDG_RUNTIME_DIR": str(runtime_dir), "TMPDIR": str(temporary)}


@contextmanager
def started_up(
    tmp_path: Path, *args: str, wait: bool = True, env: dict[str, str] | None = None
) -> Iterator[Up]:
    """``rollout-fleet up *args`` in its own session (as a terminal would run it), ``env``
    added to a new terminal's; killed, tree and all, if the test did not stop it."""
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = tmp_path / "up.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "rollout_fleet", "up", *args],
            cwd=REPO,
            env={**clean_env(runtime_dir), **(env or {})},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    up = Up(process, log, runtime_dir)
    seen: list[psutil.Process] = []
    try:
        if wait:
            up.wait_up()
            seen = up.tree()
        yield up
    finally:
        if process.poll() is None:
            seen += up.tree()
            process.kill()
        process.wait()
        for leftover in seen:  # only if the test failed: none outlives `up` otherwise
            with suppress(psutil.NoSuchProcess):
                leftover.kill()


def fleet_args(*, flower: bool = True) -> list[str]:
    """One worker, the calculator agent and a mock TrainGate, on ports of the test's own."""
    args = [*QUICK_START, "--workers", "1", "--port", str(free_port())]
    args += ["--mock-trainer-port", str(free_port())]
    return args + (["--flower-port", str(free_port())] if flower else ["--no-flower"])


def listening_ports(processes: list[psutil.Process]) -> set[int]:
    ports = set()
    for process in processes:
        for connection in process.net_connections(kind="inet"):
            if connection.status == psutil.CONN_LISTEN:
                ports.add(connection.laddr.port)
    return ports


def assert_all_gone(processes: list[psutil.Process], ports: set[int]) -> None:
    """Within GONE_SECONDS, no process of the tree remains and no port it opened answers."""
    _, alive = psutil.wait_procs(processes, timeout=GONE_SECONDS)
    assert not alive, f"outlived `up`: {[(p.pid, p.cmdline()[2:5]) for p in alive]}"
    wait_until(lambda: not any(port_open(port) for port in ports), 5, "the ports to close")


def run_folder(output: str) -> Path:
    """The log folder ``up`` named as it started."""
    return Path(output.split("starting Rollout Fleet; logs: ", 1)[1].split("\n", 1)[0])
