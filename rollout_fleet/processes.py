"""Child processes of a local fleet: start with a log file, wait for readiness, stop cleanly.

Used by ``rollout-fleet up`` and by the test suite, which runs the fleet's real processes.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_PICKER = random.SystemRandom()
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PICKED = 10000


def free_port(host: str = "127.0.0.1") -> int:
    """A port a server can listen on now, picked below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` comes from the same range as the source ports
    of outgoing connections, so between picking it and a child binding it, any connection the
    machine opens may take it. Ports below that range are only ever taken by a listener.
    """
    try:
        ephemeral_low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    if ephemeral_low > _LOWEST_PICKED + 1000:
        for _ in range(200):
            port = _PICKER.randrange(_LOWEST_PICKED, ephemeral_low)
            if port_free(port, host):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        return picked


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; ``TimeoutError`` naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:
            pass
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


def bind_error(port: int, host: str = "127.0.0.1") -> OSError | None:
    """Why a server could not listen on ``host:port`` now (in use, or a privileged port), or
    None. With ``SO_REUSEADDR``, as uvicorn and Flower bind: a closed connection's
    ``TIME_WAIT`` does not make a port busy."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
        return None


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now."""
    return bind_error(port, host) is None


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


# What servers print on their way out, whatever the cause.
_SIGN_OFFS = (
    "Application startup failed. Exiting.",
    "Waiting for application shutdown.",
    "Application shutdown complete.",
    "Finished server process",
)


@dataclass
class ManagedProcess:
    """One child process whose output goes to ``log_path``, in a session of its own (Ctrl-C
    in a terminal reaches the supervisor only), or in ``process_group`` if given (one in this
    session that the terminal does not signal either: ``rollout-fleet up``'s reaper's)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    cwd: Path | None = None
    process_group: int | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False)
    _terminated: bool = field(default=False, init=False)

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._terminated = False
        self.process = subprocess.Popen(
            list(self.argv),
            env=dict(self.env),
            cwd=self.cwd,
            # In the terminal's session, reading the terminal would stop it (SIGTTIN).
            stdin=None if self.process_group is None else subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=self.process_group is None,
            process_group=self.process_group,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.process is not None
            os.kill(self.process.pid, signum)

    def terminate(self) -> None:
        """SIGTERM, once: a second one makes uvicorn and Celery skip their clean shutdown."""
        if not self._terminated:
            self._terminated = True
            self.signal(signal.SIGTERM)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
        if self.process is None:
            return None
        if self.alive():
            self.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait()
        if self._log is not None:
            self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, no grace: a crashed machine."""
        if self.alive():
            assert self.process is not None
            self.signal(signal.SIGKILL)
            self.process.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def last_words(self) -> str:
        """The last line of the log that can say why the process ended: blank lines and a
        server's sign-off (uvicorn's "Application startup failed. Exiting.") are skipped."""
        for raw in reversed(self.output().splitlines()):
            line = raw.strip()
            if line and not any(sign_off in line for sign_off in _SIGN_OFFS):
                return line
        return "(its log is empty)"

    def exit_summary(self) -> str:
        """How it ended, why (its last words) and where its log is, in one line."""
        code = self.process.poll() if self.process is not None else None
        if code is None:
            ended = "is running"
        elif code < 0:
            ended = f"was killed by {signal.Signals(-code).name}"
        else:
            ended = f"exited with code {code}"
        return f"{self.name} {ended}: {self.last_words()} (its log: {self.log_path})"


__all__ = [
    "ManagedProcess",
    "bind_error",
    "free_port",
    "port_free",
    "port_open",
    "wait_until",
]
