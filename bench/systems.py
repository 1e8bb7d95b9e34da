"""The processes a benchmark point runs against: a mock TrainGate, the fleet, the baseline.

Everything is a real process started the way users start it; :class:`System` names the pids
whose CPU and memory count as "the server" for a point.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from rollout_core.store import Keys
from rollout_fleet.local import LocalFleet
from rollout_fleet.processes import ManagedProcess, free_port, port_open, wait_until
from rollout_fleet.redis_server import RedisServer
from rollout_sdk.backend.artifacts import ARTIFACT_ROOT_ENV

BIN = Path(sys.executable).parent
LOG_DIR = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
_ARTIFACTS = tempfile.mkdtemp(prefix="rollout-bench-artifacts-")
atexit.register(shutil.rmtree, _ARTIFACTS, ignore_errors=True)
# The fleet's gateway and workers log at warning in the bench, like the baseline's server:
# both sides pay for the same (no) logging.
QUIET = {"ROLLOUT_FLEET_LOG_LEVEL": "warning"}


@dataclass
class System:
    """One server under test: its URL and the pids of each role that counts as server CPU."""

    name: str
    url: str
    roles: dict[str, list[int]]
    redis_url: str | None = None  # the fleet's Redis (None for the baseline)
    leases_key: str | None = None  # the fleet's sorted set of held leases
    artifacts: Path | None = None  # where upstream's server writes each rollout's files


def _serve(
    name: str,
    argv: list[str],
    port: int,
    env: dict[str, str] | None = None,
    start_seconds: float = 60,
) -> ManagedProcess:
    """Start a server and wait for its port; a server that exits first fails at once with
    its output (``wait_until`` would take the exit for "not yet" until its timeout)."""
    process = ManagedProcess(name, argv, env or {}, LOG_DIR / f"{name}-{port}.log").start()
    try:
        _wait_listening(process, name, port, start_seconds)
    except BaseException:
        process.stop()
        raise
    return process


def _wait_listening(process: ManagedProcess, name: str, port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not port_open(port):
        if not process.alive():
            raise RuntimeError(f"{name} exited:\n{process.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {seconds:g}s waiting for {name}")
        time.sleep(0.05)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path.cwd())}


def _artifact_root() -> dict[str, str]:
    """Each rollout's artifacts directory (S§2.14) is made as users get it, under a root of
    the system's own on the same disk as ``~/.osmosis``; the roots go when the bench exits
    (deleting thousands of directories is filesystem work no system's figures should carry).
    """
    return {ARTIFACT_ROOT_ENV: tempfile.mkdtemp(prefix="system-", dir=_ARTIFACTS)}


@contextlib.contextmanager
def traingate(latency: float, responder: str = "calculator") -> Iterator[str]:
    """The mock TrainGate in a process of its own (calls not recorded: it keeps up)."""
    port = free_port()
    argv = [
        str(BIN / "rollout-sdk"),
        "mock-trainer",
        "--port",
        str(port),
        "--latency",
        str(latency),
        "--responder",
        responder,
        "--no-record-calls",
    ]
    process = _serve("traingate", argv, port, _env())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


@contextlib.contextmanager
def fleet(
    agent: str, workers: int, concurrency: int, env: dict[str, str] | None = None
) -> Iterator[System]:
    """Redis, one gateway process and ``workers`` worker processes."""
    artifacts = _artifact_root()
    redis = RedisServer().start()
    local = LocalFleet(
        agent=agent,
        redis_url=redis.url,
        workers=workers,
        concurrency=concurrency,
        env={**QUIET, **artifacts, **(env or {})},
        log_dir=LOG_DIR / f"fleet-{redis.port}",
    )
    try:
        local.start(timeout=120)
        roles = {
            "gateway": [p.pid for n, p in local.processes.items() if n.startswith("gateway")],
            "workers": [p.pid for n, p in local.processes.items() if n.startswith("worker")],
            "redis": [redis.process.pid] if redis.process else [],
        }
        leases = Keys(local.key_prefix).leases
        yield System(f"fleet-{workers}w", local.gateway_url, roles, redis.url, leases)
    finally:
        local.stop()
        redis.stop()


@contextlib.contextmanager
def replica(system: System) -> Iterator[RedisServer]:
    """A Redis replica of the fleet's Redis, synced before it is yielded."""
    assert system.redis_url is not None
    primary = redis.Redis.from_url(system.redis_url)
    port = primary.connection_pool.connection_kwargs["port"]
    server = RedisServer(replica_of=int(port)).start()
    link = redis.Redis(port=server.port, decode_responses=True)
    try:
        wait_until(
            lambda: link.info("replication").get("master_link_status") == "up", 30, "the replica"
        )
        yield server
    finally:
        link.close()
        primary.close()
        server.stop()


@contextlib.contextmanager
def baseline(agent: str, protocol: str, env: dict[str, str] | None = None) -> Iterator[System]:
    """Our in-process server (``create_app`` / ``create_rollout_server``) in one process."""
    port = free_port()
    if protocol == "v1":
        argv = [
            str(BIN / "rollout-sdk"),
            "serve",
            "-m",
            agent,
            "-p",
            str(port),
            "-H",
            "127.0.0.1",
            "--local",
            "--skip-register",
            "--no-validate",
            "--log-level",
            "warning",
        ]
    else:
        argv = [sys.executable, "-m", "bench.baseline_v2", agent, str(port)]
    artifacts = _artifact_root()
    process = _serve("baseline", argv, port, {**_env(), **artifacts, **(env or {})})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 30, "baseline health")
        yield System("baseline", url, {"baseline": [process.pid]})
    finally:
        process.stop()
