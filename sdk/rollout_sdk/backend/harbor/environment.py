"""Harbor's Docker environment, confined: the class every trial's environment is made of.

Harbor builds a trial's Compose project from its own files, the task's and the fleet's
overlays, and runs ``docker compose`` with that list for every step. Here, before the first
step that creates anything, Compose renders the whole model once, :func:`policy.confine`
checks and limits it, and from then on every step runs that one rendered file: what runs is
what was checked (``policy.py``). What comes back out of the sandbox (logs, rewards,
trajectories, artifacts) is copied through :meth:`DockerEngine.copy_out` against the trial's
byte budget, in a worker thread, never Harbor's unbounded ``docker cp`` into memory or disk;
a command's output is kept up to a cap. Harbor's synchronous engine probes (the daemon's OS,
a kernel probe container) are not run on the event loop.

A refusal (the policy's, or a copy over its budget) is also noted in :data:`refusals`, which
the backend sets per trial: Harbor wraps some errors in its own, and the rollout's error must
name the key, file and cap, as a ``validation_error``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import os
import posixpath
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, override

import yaml
from harbor.environments.base import ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.docker.docker import DockerEnvironment

from rollout_sdk.backend.harbor.engine import CopyBudget, DockerEngine, OverBudget
from rollout_sdk.backend.harbor.policy import (
    Limits,
    PolicyRefusal,
    SandboxPolicy,
    check_dockerfile,
    confine,
)

IMPORT_PATH = f"{__name__}:ConfinedDockerEnvironment"
OUTPUT_CAP_BYTES = 1 * 2**20  # a command's output kept in memory (the rest is counted)
REWARD_CAP_BYTES = 64 * 2**10  # reward.txt / reward.json, read whole by Harbor
MODEL_CAP_BYTES = 4 * 2**20  # the rendered Compose model
# Of the worker's environment, what ``docker compose`` needs to reach the engine.
ENGINE_ENV = (
    "PATH",
    "HOME",
    "DOCKER_HOST",
    "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "TMPDIR",
)
# Keys of a task's own compose file that read files of the host into the model.
FILE_KEYS = ("env_file", "label_file", "extends")
SMALL_FILES = {"reward.txt": REWARD_CAP_BYTES, "reward.json": REWARD_CAP_BYTES}

# Why the current trial's sandbox was refused (set per trial by the backend).
refusals: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "rollout_sandbox_refusals", default=None
)


def _note(reason: str) -> None:
    noted = refusals.get()
    if noted is not None and reason not in noted:
        noted.append(reason)


def policy_kwargs(policy: SandboxPolicy) -> dict[str, Any]:
    """The environment's constructor arguments (Harbor passes ``EnvironmentConfig.kwargs``)."""
    limits = policy.limits
    return {
        "fleet_policy": {
            "limits": {
                "memory_mb": limits.memory_mb,
                "pids": limits.pids,
                "cpus": limits.cpus,
                "disk_mb": limits.disk_mb,
                "output_mb": limits.output_mb,
            },
            "labels": dict(policy.labels),
            "mount_roots": list(policy.mount_roots),
            "fleet_mounts": sorted(policy.fleet_mounts),
            "open_networks": sorted(policy.open_networks),
            "relay": policy.relay,
            "closed": policy.closed,
            "build_network": policy.build_network,
            "allowed": sorted(policy.allowed),
            "relay_image": policy.relay_image,
            "registries": sorted(policy.registries),
        }
    }


def _policy(raw: dict[str, Any]) -> SandboxPolicy:
    return SandboxPolicy(
        limits=Limits(**raw["limits"]),
        labels=raw["labels"],
        mount_roots=tuple(raw["mount_roots"]),
        fleet_mounts=frozenset((str(a), str(b)) for a, b in raw["fleet_mounts"]),
        open_networks=frozenset(raw["open_networks"]),
        relay=raw["relay"],
        closed=raw["closed"],
        build_network=raw["build_network"],
        allowed=frozenset(raw["allowed"]),
        relay_image=raw["relay_image"],
        registries=frozenset(raw["registries"]),
    )


class ConfinedDockerEnvironment(DockerEnvironment):  # type: ignore[misc]
    def __init__(self, *args: Any, fleet_policy: dict[str, Any], **kwargs: Any) -> None:
        self._fleet_policy = _policy(fleet_policy)
        self._confined_path: Path | None = None
        # The rendered model holds the environment Harbor gives the sandbox (the agent
        # author's keys among it): kept in a folder of its own, never in the trial's folder,
        # which a failed trial leaves on the worker's disk.
        self._confined_dir: tempfile.TemporaryDirectory[str] | None = None
        self._engine = DockerEngine()
        output = self._fleet_policy.limits.output_mb * 2**20
        self._budget = CopyBudget(remaining=output, total=output, small_files=SMALL_FILES)
        super().__init__(*args, **kwargs)

    # --- the model a trial runs ---------------------------------------------------------

    @property
    @override
    def _docker_compose_paths(self) -> list[Path]:
        if self._confined_path is not None:
            return [self._confined_path]
        paths: list[Path] = super()._docker_compose_paths
        return paths

    @override
    async def _run_docker_compose_command(
        self, command: list[str], *args: Any, **kwargs: Any
    ) -> ExecResult:
        if self._confined_path is None and command[:1] != ["config"]:
            await self._confine()
        return await super()._run_docker_compose_command(command, *args, **kwargs)

    @override
    def _compose_env_vars(self, include_os_env: bool = True) -> dict[str, str]:
        """What ``docker compose`` runs with: Harbor's own variables and the task's, and of
        the worker's environment only what reaches the engine. Compose interpolates a task's
        file with these (``${VAR}``), so the worker's keys must not be among them."""
        found: dict[str, str] = super()._compose_env_vars(include_os_env=False)
        return {**engine_environment(os.environ), **found}

    async def _confine(self) -> None:
        task_file = self._environment_docker_compose_path
        if task_file.exists():
            try:
                await asyncio.to_thread(_check_task_file, task_file, self.environment_name)
            except PolicyRefusal as exc:
                _note(str(exc))
                raise
        if self._confined_dir is None:
            self._confined_dir = await asyncio.to_thread(
                tempfile.TemporaryDirectory, prefix="rollout-sandbox-compose-"
            )
        folder = Path(self._confined_dir.name)
        rendered = folder / "rendered.json"
        await super()._run_docker_compose_command(
            ["config", "--format", "json", "--output", str(rendered)]
        )
        task = self.environment_name
        fleet_mounts = frozenset(
            (str(m["source"]), str(m["target"]))
            for m in self._host_mounts
            if m.get("type") == "bind"
        )
        policy = dataclasses.replace(self._fleet_policy, fleet_mounts=fleet_mounts)
        try:
            confined = await asyncio.to_thread(_confined, rendered, policy, task)
        except PolicyRefusal as exc:
            _note(str(exc))
            raise
        finally:
            rendered.unlink(missing_ok=True)
        path = folder / "compose.json"
        await asyncio.to_thread(path.write_text, json.dumps(confined))
        self._confined_path = path

    @override
    async def stop(self, delete: bool) -> None:
        try:
            await super().stop(delete)
        finally:
            if self._confined_dir is not None:
                await asyncio.to_thread(self._confined_dir.cleanup)
                self._confined_dir = None
                self._confined_path = None

    @override
    def _validate_daemon_mode(self) -> None:
        """Harbor asks the daemon's OS with a blocking call; the fleet runs Linux tasks
        only, and the worker checked its engine when it started."""
        if self._is_windows_container:
            raise PolicyRefusal(f"task {self.environment_name}: Windows tasks are not run here")

    @classmethod
    @override
    def _egress_control_kernel_support(cls) -> bool:
        """Harbor would start a probe container (blocking, from an image of a registry);
        the fleet closes a sandbox's network itself."""
        return False

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        found = super().capabilities.model_copy()
        # A closed sandbox has no internet: a task asking for none gets what it asked.
        found.disable_internet = self._fleet_policy.closed
        found.stream = False
        return found

    # --- what comes back out ------------------------------------------------------------

    async def _container(self, service: str | None) -> str:
        result = await self._run_docker_compose_command(["ps", "-q", service or "main"])
        found = (result.stdout or "").strip().splitlines()
        if not found:
            raise RuntimeError(f"the sandbox's service {service or 'main'} is not running")
        return found[-1].strip()

    async def _copy_out(
        self, source: str, target: Path | str, service: str | None, *, single: bool
    ) -> None:
        container = await self._container(service)
        path = posixpath.normpath(source)
        try:
            await self._engine.copy_out(container, path, Path(target), self._budget, single=single)
        except OverBudget as exc:
            _note(str(exc))
            raise

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._copy_out(source_path, target_path, None, single=True)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._copy_out(source_dir, target_dir, None, single=False)

    @override
    async def service_download_file(
        self, source_path: str, target_path: Path | str, *, service: str | None = None
    ) -> None:
        await self._copy_out(source_path, target_path, service, single=True)

    @override
    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        await self._copy_out(source_dir, target_dir, service, single=False)

    @staticmethod
    @override
    async def _collect_buffered_output(
        process: asyncio.subprocess.Process,
        *,
        timeout_sec: int | None,
        stdin_data: bytes | None = None,
    ) -> ExecResult:
        """A command's output, its first :data:`OUTPUT_CAP_BYTES` kept and the rest counted:
        Harbor holds all of it in memory, and a sandbox decides how much there is."""

        async def collect() -> tuple[bytes, int]:
            if stdin_data is not None and process.stdin is not None:
                process.stdin.write(stdin_data)
                await process.stdin.drain()
                process.stdin.close()
            kept = bytearray()
            dropped = 0
            assert process.stdout is not None
            while chunk := await process.stdout.read(64 * 1024):
                room = OUTPUT_CAP_BYTES - len(kept)
                kept += chunk[: max(room, 0)]
                dropped += max(len(chunk) - max(room, 0), 0)
            await process.wait()
            return bytes(kept), dropped

        try:
            async with asyncio.timeout(timeout_sec or None):
                kept, dropped = await collect()
        except TimeoutError:
            await DockerEnvironment._terminate_process(process)
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        except BaseException:
            await DockerEnvironment._terminate_process(process)
            raise
        text = kept.decode(errors="replace")
        if dropped:
            text += f"\n[{dropped} more bytes of output not kept]\n"
        return ExecResult(stdout=text or None, stderr=None, return_code=process.returncode or 0)


def engine_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Of a process's environment, only what ``docker compose`` needs to reach the engine."""
    return {name: environ[name] for name in ENGINE_ENV if name in environ}


def _check_task_file(path: Path, task: str) -> None:
    """The task's own compose file, before Compose renders it: rendering reads the files its
    ``env_file``, ``label_file``, ``extends`` and ``include`` name into the model, so they must
    be files of the task (in a worker thread)."""
    with path.open("rb") as source:
        data = source.read(MODEL_CAP_BYTES + 1)
    if len(data) > MODEL_CAP_BYTES:
        raise PolicyRefusal(f"task {task}: its docker-compose.yaml is over {MODEL_CAP_BYTES} bytes")
    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError:
        return  # Compose refuses it with its own message
    if not isinstance(document, dict):
        return
    folder = os.path.realpath(path.parent.parent)  # the task's folder
    named: list[tuple[str, Any]] = [("include", document.get("include"))]
    for name, service in (document.get("services") or {}).items():
        if isinstance(service, dict):
            named += [(f"services.{name}.{key}", service.get(key)) for key in FILE_KEYS]
    for where, value in named:
        for file in _files(value):
            if "$" in file:
                raise PolicyRefusal(
                    f"task {task}: {where} names {file}, with a variable in it: a task's files "
                    "are named as they are"
                )
            resolved = os.path.realpath(os.path.join(path.parent, file))
            if resolved != folder and not resolved.startswith(folder + "/"):
                raise PolicyRefusal(
                    f"task {task}: {where} names {file}, outside the task: a task reads only "
                    "its own files"
                )


def _files(value: Any) -> list[str]:
    """The file paths a compose key's value names (a string, a list, or mappings with
    ``path`` / ``file``)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [str(v) for k, v in value.items() if k in ("path", "file") and v]
    if isinstance(value, list):
        return [f for item in value for f in _files(item)]
    return []


def _confined(rendered: Path, policy: SandboxPolicy, task: str) -> dict[str, Any]:
    """The rendered model read (up to its cap) and confined, links in bind mounts followed
    (in a worker thread)."""
    with rendered.open("rb") as source:
        data = source.read(MODEL_CAP_BYTES + 1)
    if len(data) > MODEL_CAP_BYTES:
        raise PolicyRefusal(f"task {task}: its Compose model is over {MODEL_CAP_BYTES} bytes")
    policy = dataclasses.replace(
        policy,
        mount_roots=tuple(os.path.realpath(root) for root in policy.mount_roots),
        fleet_mounts=frozenset((os.path.realpath(a), b) for a, b in policy.fleet_mounts),
    )
    confined = confine(json.loads(data), policy, task, os.path.realpath)
    for service in confined["services"].values():
        build = service.get("build")
        if build:  # a service Compose builds: what its Dockerfile makes the engine fetch
            dockerfile = Path(build["context"]) / str(build.get("dockerfile") or "Dockerfile")
            check_dockerfile(_read_text(dockerfile, MODEL_CAP_BYTES, task), policy, task)
    return confined


def _read_text(path: Path, cap: int, task: str) -> str:
    try:
        with path.open("rb") as source:
            data = source.read(cap + 1)
    except OSError:
        return ""  # Compose names what is missing
    if len(data) > cap:
        raise PolicyRefusal(f"task {task}: {path.name} is over {cap} bytes")
    return data.decode(errors="replace")


__all__ = [
    "IMPORT_PATH",
    "ConfinedDockerEnvironment",
    "engine_environment",
    "policy_kwargs",
    "refusals",
]
