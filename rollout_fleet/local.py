"""A whole fleet on this machine: gateway, workers, Flower (and optionally a mock TrainGate).

``rollout-fleet up`` runs one for humans; the test suite runs the same processes, started
with the same commands, against its own redis-server.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography.fernet import Fernet
from pydantic import ValidationError

from rollout_core.settings import FleetSettings
from rollout_fleet.probe import ProbeFailed, probe_gateway
from rollout_fleet.processes import ManagedProcess, free_port, port_open
from rollout_gateway.ready import Readiness

STOP_GRACE_SECONDS = 15.0

Progress = Callable[[str], None]
"""Hears one line per step of a fleet's start ("gateway ✓ http://…")."""


def _timed_out(timeout: float, awaited: list[str], last_answer: str) -> TimeoutError:
    said = f" (its last answer: {last_answer})" if last_answer else ""
    return TimeoutError(f"timed out after {timeout:g}s waiting for {', '.join(awaited)}{said}")


def _hear_listening(listeners: dict[str, tuple[int, str]], tell: Progress) -> None:
    """Tell of (and forget) each of ``listeners`` (name: port, URL) that listens now."""
    for name, (port, url) in list(listeners.items()):
        if port_open(port):
            del listeners[name]
            tell(f"{name.removeprefix('the ')} ✓ {url}")


class ChildExited(RuntimeError):
    """A process of the fleet exited while it started: it will not become ready. The message
    names it, its exit code, the last line of its log (why, usually) and the log's path."""

    def __init__(self, process: ManagedProcess) -> None:
        self.process = process
        super().__init__(process.exit_summary())


def fleet_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rollout_fleet", *args]


@dataclass
class LocalFleet:
    """Configure, then :meth:`start`; every process logs to ``log_dir/<name>.log``."""

    agent: str
    redis_url: str
    workers: int = 2
    concurrency: int | None = None
    gateway_workers: int = 1  # processes sharing the gateway port
    gateways: int = 1  # gateways on ports of their own (gateway_port, then free ports)
    flower: bool = False
    mock_trainer: str | None = None  # a responder name starts a mock TrainGate
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rollout-fleet-")))
    gateway_port: int = field(default_factory=free_port)
    flower_port: int = field(default_factory=free_port)
    mock_trainer_port: int = field(default_factory=free_port)
    flower_auth: str = field(default_factory=lambda: f"admin:{secrets.token_urlsafe(12)}")
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    process_group: int | None = None  # every process joins it (see ManagedProcess)

    extra_gateway_ports: list[int] = field(default_factory=list)
    worker_metrics_ports: dict[int, int] = field(default_factory=dict)  # worker index → port

    def __post_init__(self) -> None:
        self.extra_gateway_ports = [free_port() for _ in range(self.gateways - 1)]
        # One key for the fleet's life: a worker restarted later must open what the gateway
        # sealed before.
        self._secret_key = os.environ.get(
            "ROLLOUT_FLEET_SECRET_KEY", Fernet.generate_key().decode()
        )

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def gateway_urls(self) -> list[str]:
        ports = [self.gateway_port, *self.extra_gateway_ports]
        return [f"http://127.0.0.1:{port}" for port in ports]

    @property
    def flower_url(self) -> str:
        return f"http://127.0.0.1:{self.flower_port}"

    @property
    def mock_trainer_url(self) -> str:
        return f"http://127.0.0.1:{self.mock_trainer_port}"

    @property
    def key_prefix(self) -> str:
        default: str = FleetSettings.model_fields["key_prefix"].default
        return self.env.get("ROLLOUT_FLEET_KEY_PREFIX", default)

    def process_env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "REDIS_URL": self.redis_url,
            "AGENT": self.agent,
            "ROLLOUT_FLEET_SECRET_KEY": self._secret_key,
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> ManagedProcess:
        log = self.log_dir / f"{name}.log"
        process = ManagedProcess(name, argv, env, log, process_group=self.process_group).start()
        self.processes[name] = process
        return process

    def start_worker(self, index: int, env: dict[str, str] | None = None) -> ManagedProcess:
        """Worker ``index`` serves its metrics on a port of its own (kept across restarts)."""
        argv = fleet_command("worker", "--name", f"worker{index}@%h")
        if self.concurrency is not None:
            argv += ["--concurrency", str(self.concurrency)]
        port = self.worker_metrics_ports.setdefault(index, free_port())
        env = {**(env or self.process_env()), "ROLLOUT_FLEET_METRICS_PORT": str(port)}
        return self._spawn(f"worker-{index}", argv, env)

    def worker_metrics_urls(self) -> list[str]:
        ports = sorted(self.worker_metrics_ports.items())
        return [f"http://127.0.0.1:{port}/metrics" for _, port in ports]

    def restart_dead_workers(self) -> list[str]:
        """What a supervisor (compose's restart policy) does: start dead workers again. A
        worker exits by itself when an agent blocked its event loop (it recycles itself)."""
        dead = [
            name
            for name, process in self.processes.items()
            if name.startswith("worker-") and not process.alive()
        ]
        for name in dead:
            self.processes[name].stop()  # reaps it, closes its log
            self.start_worker(int(name.removeprefix("worker-")))
        return dead

    def start_gateway(self, env: dict[str, str] | None = None, index: int = 1) -> ManagedProcess:
        port = self.gateway_port if index == 1 else self.extra_gateway_ports[index - 2]
        argv = fleet_command(
            "gateway",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(self.gateway_workers),
        )
        name = "gateway" if index == 1 else f"gateway-{index}"
        return self._spawn(name, argv, env or self.process_env())

    def start(self, timeout: float = 60.0, progress: Progress | None = None) -> LocalFleet:
        """Start every process, then :meth:`wait_ready` (``progress`` hears each part ready)."""
        env = self.process_env()
        if self.mock_trainer is not None:
            self._spawn(
                "mock-trainer",
                fleet_command(
                    "mock-trainer",
                    "--port",
                    str(self.mock_trainer_port),
                    "--responder",
                    self.mock_trainer,
                ),
                env,
            )
        for index in range(1, self.gateways + 1):
            self.start_gateway(env, index)
        for index in range(1, self.workers + 1):
            self.start_worker(index, env)
        if self.flower:
            self._spawn(
                "flower",
                fleet_command("flower", "--port", str(self.flower_port), "--address", "127.0.0.1"),
                {**env, "FLOWER_BASIC_AUTH": self.flower_auth},
            )
        self.wait_ready(timeout, progress)
        return self

    def api_key(self) -> str | None:
        """The server key the gateways require: the one their environment gives them (this
        fleet's ``env``, else this process's environment or ``.env``, as the children read
        them)."""
        key = self.env.get("ROLLOUT_FLEET_API_KEY")
        if key:
            return key
        try:
            secret = FleetSettings().api_key
        except ValidationError:  # the children refuse such settings; they have no key to use
            return None
        return secret.get_secret_value() if secret is not None else None

    def _auth(self) -> dict[str, str]:
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def readiness(self, url: str | None = None) -> Readiness:
        """A gateway's ``/ready`` (raises ``ProbeFailed`` unless it is ready)."""
        return probe_gateway(url or self.gateway_url, self.api_key())

    def _check_alive(self) -> None:
        for process in self.processes.values():
            if not process.alive():
                raise ChildExited(process)

    def wait_ready(self, timeout: float, progress: Progress | None = None) -> None:
        """Wait until every gateway is ready, the workers have checked in, and Flower and the
        mock TrainGate listen; ``progress`` hears each step as it happens. A process that
        exits meanwhile raises :class:`ChildExited` at once (it will not become ready);
        ``TimeoutError`` names what was still awaited, and the last answer it got."""
        tell = progress or (lambda _: None)
        key = self.api_key()
        deadline = time.monotonic() + timeout
        listeners: dict[str, tuple[int, str]] = {}  # what only has to listen
        if self.flower:
            listeners["Flower"] = (self.flower_port, self.flower_url)
        if self.mock_trainer is not None:
            listeners["the mock TrainGate"] = (self.mock_trainer_port, self.mock_trainer_url)
        gateways_ready, workers_shown, last_answer = False, -1, ""
        while True:
            self._check_alive()
            _hear_listening(listeners, tell)
            try:
                if not gateways_ready:
                    for url in self.gateway_urls:
                        probe_gateway(url, key)
                    gateways_ready = True
                    tell(f"gateway ✓ {', '.join(self.gateway_urls)}")
                workers = min(probe_gateway(self.gateway_url, key).workers, self.workers)
                if workers != workers_shown:
                    workers_shown = workers
                    done = " ✓" if workers == self.workers else ""
                    tell(f"workers {workers}/{self.workers}{done}")
            except (ProbeFailed, httpx.HTTPError, ValueError) as exc:
                last_answer = str(exc)
            if workers_shown == self.workers and not listeners:
                return
            if time.monotonic() >= deadline:
                awaited = [*listeners]
                if not gateways_ready:
                    awaited.insert(0, "the gateway")
                elif workers_shown < self.workers:
                    awaited.insert(0, f"the workers ({max(workers_shown, 0)} ready)")
                raise _timed_out(timeout, awaited, last_answer)
            time.sleep(0.1)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Every fleet process shuts down at once; together they get ``grace`` seconds, then
        the stragglers are killed (waiting for each in turn, a loaded machine took over a
        minute). The mock TrainGate goes last: a worker finishing its rollouts still needs
        it (stopped with them, it left those rollouts retrying calls until the end)."""
        last = [p for name, p in self.processes.items() if name == "mock-trainer"]
        fleet = [p for p in self.processes.values() if p not in last]
        for group in (fleet, last):
            for process in group:
                process.terminate()
            deadline = time.monotonic() + grace
            for process in group:
                process.stop(grace=max(0.1, deadline - time.monotonic()))

    def speaks_v2(self) -> bool:
        """A v2 gateway's health names its deployment (``process_id``); a v1 one does not."""
        health = httpx.get(f"{self.gateway_url}/health", headers=self._auth(), timeout=5).json()
        return "process_id" in health

    def sample_request(self, rollout_id: str = "demo-1") -> tuple[str, str, str]:
        """(path, body, result URL) of a ready-to-send rollout for the mock TrainGate."""
        messages = [
            {"role": "system", "content": "Use the tools; answer as #### <number>."},
            {"role": "user", "content": "What is 12 * 5?"},
        ]
        body: dict[str, Any]
        if self.speaks_v2():
            body = {
                "rollout_id": rollout_id,
                "initial_messages": messages,
                "chat_completions_url": f"{self.mock_trainer_url}/v1/rollouts/{rollout_id}",
                "label": "60",
            }
            result = f"{self.gateway_url}/rollout/{rollout_id}/result"
            return "/rollout", json.dumps(body), result
        body = {
            "rollout_id": rollout_id,
            "server_url": self.mock_trainer_url,
            "messages": messages,
            "completion_params": {"temperature": 0.7},
            "metadata": {"ground_truth": "60"},
        }
        result = f"{self.mock_trainer_url}/v1/rollout/completed/{rollout_id}"
        return "/v1/rollout/init", json.dumps(body), result


__all__ = ["ChildExited", "LocalFleet", "Progress", "fleet_command"]
