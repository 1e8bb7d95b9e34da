"""Run ``docker-compose.yml`` without a Docker engine: every service's command as a local
process, with the environment compose would give its container.

The Compose v2 CLI renders the file (interpolation from the project's ``.env``, ``env_file``,
anchors, defaults) exactly as ``docker compose up`` would; this module only translates the
container world to this machine:

* the image's ``ENTRYPOINT``/``CMD``/``ENV``/``WORKDIR`` come from the service's Dockerfile
  (its final stage), so a change there changes what runs here;
* mounted paths map to their sources (``/agent`` → the bind source) and the image's
  virtualenv (``/app/.venv``) to one built by its Dockerfile's build stage (dockerfile.py);
* service hostnames (``redis``) become ``127.0.0.1``; a service listens on its container
  port, which therefore must differ between services (the compose file makes them variables);
* every replica gets its own working directory and ``/tmp`` (``TMPDIR``), as a container has;
* a dependent service starts only once its ``service_healthy`` dependencies pass their own
  declared healthcheck, run inside the "container" like Docker runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import compose

from rollout_fleet.processes import ManagedProcess
from rollout_fleet.redis_server import redis_server_binary
from tests.deploy.dockerfile import NO_IMAGE, Image, ImageBuilder

COMPOSE_BINARY = Path(compose.__file__).parent / "docker-compose"
IMAGE_VENV = "/app/.venv"


def render(project: Path) -> dict[str, Any]:
    """``docker compose config`` of the project, interpolated from its ``.env`` only."""
    result = subprocess.run(
        [str(COMPOSE_BINARY), "config", "--format", "json"],
        cwd=project,
        env={"PATH": os.environ["PATH"], "HOME": str(project)},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"docker compose config failed: {result.stderr}")
    config: dict[str, Any] = json.loads(result.stdout)
    return config


@dataclass
class Container:
    """One replica of a service, as a local process."""

    service: str
    replica: int
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    healthcheck: list[str] | None
    process: ManagedProcess | None = None

    @property
    def name(self) -> str:
        return f"{self.service}-{self.replica}"

    def healthy(self) -> bool:
        if self.healthcheck is None:
            return self.process is not None and self.process.alive()
        try:
            result = subprocess.run(
                self.healthcheck,
                env=self.env,
                cwd=self.cwd,
                capture_output=True,
                timeout=30,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0


@dataclass
class ComposeAsProcesses:
    """Start with :meth:`up`; :meth:`down` stops every process, dependents first."""

    project: Path
    runtime_dir: Path
    builder: ImageBuilder
    config: dict[str, Any] = field(init=False)
    containers: list[Container] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.config = render(self.project)

    @property
    def services(self) -> dict[str, Any]:
        services: dict[str, Any] = self.config["services"]
        return services

    def container_port(self, service: str) -> int:
        (port,) = self.services[service]["ports"]
        return int(port["target"])

    def replicas(self, service: str) -> list[Container]:
        return [c for c in self.containers if c.service == service]

    def up(self, *services: str, timeout: float = 120.0) -> ComposeAsProcesses:
        """Start these services (default: all) and what they depend on, not yet running,
        and wait until every one passes its healthcheck."""
        wanted = self._startup_order(services or tuple(self.services))
        for service in wanted:
            if self.replicas(service):
                continue
            for dependency, condition in self.services[service].get("depends_on", {}).items():
                if condition["condition"] == "service_healthy":
                    self.wait_healthy(dependency, timeout)
            count = int(self.services[service].get("deploy", {}).get("replicas", 1))
            for replica in range(1, count + 1):
                self._start(self._container(service, replica))
        for service in wanted:
            self.wait_healthy(service, timeout)
        return self

    def down(self) -> None:
        for container in reversed(self.containers):
            if container.process is not None:
                container.process.stop(grace=30)

    def wait_healthy(self, service: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for container in self.replicas(service):
            while not container.healthy():
                if container.process is None or not container.process.alive():
                    raise AssertionError(f"{container.name} exited:\n{self.logs()}")
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{container.name} failed its healthcheck for {timeout:g}s\n{self.logs()}"
                    )
                time.sleep(0.5)

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {c.name} ---\n{c.process.output()[-tail:]}" for c in self.containers if c.process
        )

    def all_logs(self) -> str:
        return "\n".join(c.process.output() for c in self.containers if c.process)

    # --- translation ----------------------------------------------------------------------

    def _startup_order(self, services: tuple[str, ...]) -> list[str]:
        order: list[str] = []

        def visit(service: str) -> None:
            for dependency in self.services[service].get("depends_on", {}):
                visit(dependency)
            if service not in order:
                order.append(service)

        for service in services:
            visit(service)
        return order

    def _image(self, spec: dict[str, Any]) -> Image:
        build = spec.get("build")
        if build is None:  # a published image (redis): its entrypoint passes commands through
            return NO_IMAGE
        return Image.from_dockerfile(Path(build["context"]) / build["dockerfile"])

    def _container(self, service: str, replica: int) -> Container:
        spec = self.services[service]
        image = self._image(spec)
        root = self.runtime_dir / f"{service}-{replica}"
        tmp = root / "tmp"
        tmp.mkdir(parents=True)
        paths = {}
        if "build" in spec:  # the image's virtualenv, built from its Dockerfile's build stage
            context = Path(spec["build"]["context"])
            dockerfile = context / spec["build"]["dockerfile"]
            paths[IMAGE_VENV] = str(self.builder.venv(dockerfile, context))
        for volume in spec.get("volumes", []):
            if volume["type"] == "bind":
                paths[volume["target"]] = volume["source"]
            else:  # a named volume: private to this replica here
                named = root / volume["source"]
                named.mkdir()
                paths[volume["target"]] = str(named)
        cwd = Path(paths.get(image.workdir, str(root)))

        def to_host(value: str) -> str:
            for target, source in paths.items():
                value = re.sub(rf"(?<![\w.-]){re.escape(target)}(?=/|:|$)", source, value)
            hosts = "|".join(map(re.escape, self.services))
            return re.sub(rf"(?<=[@/])({hosts})(?=[:/])", "127.0.0.1", value)

        base_path = os.pathsep.join([str(Path(redis_server_binary()).parent), "/usr/bin", "/bin"])
        env = {"PATH": base_path, "HOME": str(root), "LANG": "C.UTF-8", "TMPDIR": str(tmp)}
        for name, value in image.env.items():
            env[name] = to_host(value.replace("$PATH", env.get("PATH", "")))
        environment = spec.get("environment", {})
        env.update({name: to_host(value or "") for name, value in environment.items()})

        entrypoint = spec.get("entrypoint") or image.entrypoint
        command = spec.get("command") or image.cmd
        argv = [to_host(_unescape(arg)) for arg in [*entrypoint, *command]]
        return Container(service, replica, argv, env, cwd, self._healthcheck(spec, to_host))

    @staticmethod
    def _healthcheck(spec: dict[str, Any], to_host: Any) -> list[str] | None:
        test = spec.get("healthcheck", {}).get("test")
        if not test:
            return None
        kind, *rest = [to_host(_unescape(part)) for part in test]
        if kind == "CMD-SHELL":
            return ["sh", "-c", *rest]
        assert kind == "CMD", f"unsupported healthcheck {test}"
        return rest

    def _start(self, container: Container) -> None:
        container.process = ManagedProcess(
            container.name,
            container.argv,
            container.env,
            self.runtime_dir / "logs" / f"{container.name}.log",
            cwd=container.cwd,
        ).start()
        self.containers.append(container)


def _unescape(value: str) -> str:
    """``config`` output keeps ``$$`` (a literal ``$`` for the container's shell)."""
    return value.replace("$$", "$")
