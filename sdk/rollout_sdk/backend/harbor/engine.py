"""The one boundary between the fleet and the engine its sandboxes run on.

Everything the fleet asks of a Docker engine goes through :class:`DockerEngine`: build an
image (no network unless the operator named one, intermediate containers always removed,
labelled as the fleet's), tell whether an image exists, copy what a sandbox wrote out of it
(against a byte budget, off the event loop), measure what a sandbox wrote to its own disk,
list the fleet's labelled sandboxes and remove one. The backend and the janitor call it; the
policy a sandbox runs under (``policy.py``) is applied in the Harbor environment class
(``environment.py``) before any container exists. A second engine (a remote Docker over
TLS needs nothing new; a Kubernetes pod backend) is one new class with these methods.

The engine is reached with the ``docker`` CLI (as Harbor itself does), on ``DOCKER_HOST``,
from asyncio subprocesses or worker threads, so nothing here blocks an event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from rollout_sdk.backend.harbor.sandbox import (
    EXECUTION_LABEL,
    FLEET_LABEL,
    LABELS,
    PROJECT_LABEL,
    RECORD_LABEL,
    ROLLOUT_LABEL,
)

ENGINE_TIMEOUT_SECONDS = 60.0
BUILD_TIMEOUT_SECONDS = 1800.0
BUILT_LABEL = "org.rollout-fleet.built"  # every image the fleet builds carries it
PROXIED = "proxied"  # the build network of the fleet's own: a proxy to the internet only
PROXY_PORT = 3128
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
PROXY_LIMITS = ("--memory=128m", "--memory-swap=128m", "--pids-limit=64", "--cpus=0.5")
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours in the CLI's errors
_CHUNK = 64 * 1024


class EngineError(RuntimeError):
    """The Docker engine refused a call or could not be reached."""


class BuildFailed(EngineError):
    """A task's image did not build: the task's fault. :attr:`step` says which step failed
    in Docker's own words, never what the engine fetched or a registry answered."""

    @property
    def step(self) -> str:
        said = str(self)
        exited = re.search(r"returned a non-zero code: (\d+)", said)
        if exited is not None:
            return f"a RUN step exited {exited.group(1)}"
        parse = re.search(r"dockerfile parse error (?:on )?line (\d+)", said, re.IGNORECASE)
        if parse is not None:
            return f"its Dockerfile does not parse (line {parse.group(1)})"
        return "docker build failed (its Dockerfile, or a base image the engine lacks)"


class OverBudget(ValueError):
    """What a sandbox wrote is larger than the fleet takes from it; the message names the
    file and the cap."""


@dataclass(frozen=True)
class LabelledSandbox:
    """One trial's labelled objects, as the engine lists them."""

    fleet: str
    record: str
    rollout: str
    execution: str
    project: str


@dataclass
class CopyBudget:
    """How many bytes one trial may still copy out of its sandbox, and the smaller cap of
    the files whose whole text the fleet reads (rewards)."""

    remaining: int
    total: int
    small_files: Mapping[str, int] = field(default_factory=dict)

    def take(self, name: str, size: int) -> None:
        cap = self.small_files.get(posixpath.basename(name))
        if cap is not None and size > cap:
            raise OverBudget(f"the sandbox's {name} is {size} bytes, over its cap of {cap} bytes")
        if size > self.remaining:
            raise OverBudget(
                f"the sandbox's {name} ({size} bytes) takes what it wrote past the "
                f"{self.total // 2**20} MB the fleet copies out of one sandbox "
                "(ROLLOUT_FLEET_SANDBOX_OUTPUT_MB)"
            )
        self.remaining -= size


class SandboxEngine(Protocol):
    """What the fleet needs of an engine that runs sandboxes."""

    async def check_ready(self) -> None: ...
    async def build(
        self,
        context: Path,
        tag: str,
        *,
        network: str,
        labels: Mapping[str, str],
        proxy: tuple[str, frozenset[str]] | None = None,
    ) -> None: ...
    async def tag(self, image: str, tag: str) -> None: ...
    async def image_exists(self, tag: str) -> bool: ...
    async def copy_out(
        self, container: str, path: str, target: Path, budget: CopyBudget, *, single: bool
    ) -> None: ...
    async def disk_written(self, label: str) -> int: ...
    async def labelled_sandboxes(self, fleet: str) -> list[LabelledSandbox]: ...
    async def remove_project(self, project: str) -> int: ...
    async def remove_trial(self, trial_name: str) -> int: ...


def docker_cli() -> str:
    found = shutil.which("docker")
    if found is None:
        raise EngineError(
            "the docker CLI is not on PATH: install Docker's client (and its compose plugin) "
            "on every host that runs sandboxed rollouts"
        )
    return found


def _reason(err: bytes) -> str:
    said = _ESCAPES.sub("", err.decode(errors="replace")).strip().splitlines()
    errors = [line for line in said if line.lstrip().upper().startswith("ERROR")]
    return (errors or said or ["no output"])[-1].strip()[:500]


async def docker(
    *args: str, seconds: float = ENGINE_TIMEOUT_SECONDS, env: Mapping[str, str] | None = None
) -> str:
    """Run ``docker <args>``; its stdout. One-line :class:`EngineError` on failure."""
    process = await asyncio.create_subprocess_exec(
        docker_cli(),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        async with asyncio.timeout(seconds):
            out, err = await process.communicate()
    except BaseException:
        if process.returncode is None:
            process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        raise EngineError(f"docker {args[0]} failed: {_reason(err)}")
    return out.decode(errors="replace")


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


class DockerEngine:
    """A Docker engine on ``DOCKER_HOST``, through its CLI."""

    async def check_ready(self) -> None:
        """The CLI, its compose plugin and the engine all answer; else one line naming
        which is missing and where it is looked for."""
        docker_cli()
        try:
            await docker("compose", "version", seconds=20)
        except EngineError:
            config = os.environ.get("DOCKER_CONFIG") or "~/.docker"
            raise EngineError(
                "the docker CLI has no compose plugin: install Docker Compose v2 where the "
                f"client finds it ({config}/cli-plugins/docker-compose, or the system's "
                "cli-plugins folder); sandboxed rollouts run `docker compose`"
            ) from None
        try:
            await docker("version", "--format", "{{.Server.Version}}", seconds=20)
        except (EngineError, TimeoutError) as exc:
            where = os.environ.get("DOCKER_HOST") or "the default socket"
            raise EngineError(f"the Docker engine at {where} does not answer: {exc}") from None

    async def build(
        self,
        context: Path,
        tag: str,
        *,
        network: str,
        labels: Mapping[str, str],
        proxy: tuple[str, frozenset[str]] | None = None,
    ) -> None:
        """Build ``context`` as ``tag``: on ``network`` (``none`` unless the operator named
        another), its intermediate containers removed whether it succeeds or fails. On
        :data:`PROXIED`, ``proxy`` is the relay's image and the hosts it may reach beside the
        internet: the build runs on an internal network whose one way out is that proxy."""
        tags = [f"--label={name}={value}" for name, value in {BUILT_LABEL: "1", **labels}.items()]
        if network == PROXIED:
            if proxy is None:
                raise EngineError("a proxied build needs the relay's image")
            async with self._build_proxy(*proxy) as (inside, address):
                settings = [
                    f"--build-arg={v}=http://{address}:{PROXY_PORT}" for v in PROXY_VARIABLES
                ]
                await self._build(
                    "build", "-q", "--force-rm", f"--network={inside}", *settings, *tags,
                    "-t", tag, str(context),
                    seconds=BUILD_TIMEOUT_SECONDS,
                    env={"DOCKER_BUILDKIT": "0"},  # BuildKit takes no network of the engine's
                )  # fmt: skip
            return
        await self._build(
            "build",
            "-q",
            "--force-rm",
            f"--network={network}",
            *tags,
            "-t",
            tag,
            str(context),
            seconds=BUILD_TIMEOUT_SECONDS,
        )

    @contextlib.asynccontextmanager
    async def _build_proxy(
        self, image: str, hosts: frozenset[str]
    ) -> AsyncIterator[tuple[str, str]]:
        """An internal network and a proxy on it with a way out, for one build; removed
        after it, however it ends. Yields the network's name and the proxy's address."""
        name = f"rollout-fleet-build-{uuid.uuid4().hex[:12]}"
        labels = [f"--label={BUILT_LABEL}=proxy"]
        closed = "--opt=com.docker.network.bridge.inhibit_ipv4=true"
        try:
            await docker("network", "create", "--internal", closed, *labels, f"{name}-in")
            await docker("network", "create", *labels, f"{name}-out")
            listed = ",".join(sorted(hosts)) or ","
            await docker(
                "run", "-d", "--name", name, f"--network={name}-in", *labels, *PROXY_LIMITS,
                "--cap-drop=ALL", "--security-opt=no-new-privileges:true", "--init",
                image, "python3", "/relay.py", "proxy", str(PROXY_PORT), listed,
            )  # fmt: skip
            await docker("network", "connect", f"{name}-out", name)
            found = await docker(
                "inspect", "--format",
                "{{(index .NetworkSettings.Networks \"" + f"{name}-in" + "\").IPAddress}}", name,
            )  # fmt: skip
            yield f"{name}-in", found.strip()
        finally:
            with contextlib.suppress(EngineError):
                await docker("rm", "-f", name)
            for network in (f"{name}-in", f"{name}-out"):
                with contextlib.suppress(EngineError):
                    await docker("network", "rm", network)

    async def _build(
        self, *args: str, seconds: float, env: Mapping[str, str] | None = None
    ) -> None:
        try:
            await docker(*args, seconds=seconds, env=env)
        except EngineError as exc:
            raise BuildFailed(str(exc).removeprefix("docker build failed: ")) from None

    async def tag(self, image: str, tag: str) -> None:
        """Name ``image`` (one the engine holds) ``tag`` as well."""
        await docker("tag", image, tag)

    async def image_exists(self, tag: str) -> bool:
        try:
            await docker("image", "inspect", "--format", "{{.Id}}", tag)
        except EngineError:
            return False
        return True

    async def copy_out(
        self, container: str, path: str, target: Path, budget: CopyBudget, *, single: bool
    ) -> None:
        """Copy ``path`` out of ``container`` into ``target`` (a folder's content, or with
        ``single`` one file) as a tar stream read in chunks in a worker thread: each entry's
        size is charged to ``budget`` before its bytes are read, so an entry over the cap
        stops the copy at its header. Only folders and regular files come out (no links,
        devices or paths outside ``target``)."""
        argv = [docker_cli(), "cp", f"{container}:{path}", "-"]
        started: list[subprocess.Popen[bytes]] = []
        try:
            await asyncio.to_thread(_copy_out, argv, target, budget, single, started)
        finally:
            for process in started:  # a cancel leaves the thread reading: end its source
                if process.poll() is None:
                    process.kill()

    async def disk_written(self, label: str) -> int:
        """Bytes the containers labelled ``label`` (``key=value``) wrote to their own layers
        and to the volumes they mount (declared, anonymous or a Dockerfile's ``VOLUME``)."""
        text = await docker(
            "ps", "-a", "--size", "--no-trunc", "--filter", f"label={label}",
            "--format", "{{json .}}",
        )  # fmt: skip
        written = 0
        mounted: set[str] = set()
        for line in _lines(text):
            listed = json.loads(line)
            written += _bytes(str(listed.get("Size", "")).split(" ", 1)[0])
            mounted |= {name for name in str(listed.get("Mounts") or "").split(",") if name}
        if mounted:
            usage = json.loads(await docker("system", "df", "-v", "--format", "{{json .Volumes}}"))
            for volume in usage or []:
                if volume.get("Name") in mounted:
                    written += _bytes(str(volume.get("Size", "")))
        return written

    async def _ids(self, kind: str, label: str) -> list[str]:
        if kind == "container":
            return _lines(await docker("ps", "-aq", "--no-trunc", "--filter", f"label={label}"))
        return _lines(await docker(kind, "ls", "-q", "--filter", f"label={label}"))

    async def remove_project(self, project: str) -> int:
        """Remove every container, network and volume of one Compose project (a trial's
        environment, or its separate verifier's); how many objects went. Idempotent."""
        label = f"{PROJECT_LABEL}={project}"
        removed = 0
        containers = await self._ids("container", label)
        if containers:
            await docker("rm", "-f", "-v", *containers)
            removed += len(containers)
        for kind in ("network", "volume"):
            found = await self._ids(kind, label)
            if found:
                await docker(kind, "rm", *found)
                removed += len(found)
        return removed

    async def trial_projects(self, trial_name: str) -> list[str]:
        """The Compose projects of one trial (Harbor names them ``<trial>__env`` and so on)."""
        found: set[str] = set()
        for listing in (("ps", "-a"), ("network", "ls"), ("volume", "ls")):
            text = await docker(
                *listing,
                "--filter",
                f"label={PROJECT_LABEL}",
                "--format",
                '{{.Label "' + PROJECT_LABEL + '"}}',
            )
            found.update(_lines(text))
        stem = trial_name.lower()
        return sorted(
            p for p in found if p == stem or p.startswith(f"{stem}__") or p.startswith(f"{stem}_")
        )

    async def remove_trial(self, trial_name: str) -> int:
        removed = 0
        for project in await self.trial_projects(trial_name):
            removed += await self.remove_project(project)
        return removed

    async def labelled_sandboxes(self, fleet: str) -> list[LabelledSandbox]:
        """Every trial of ``fleet`` the engine holds a labelled container or network of (read
        with ``inspect``: ids may hold any character, commas included)."""
        label = f"{FLEET_LABEL}={fleet}"
        found: dict[str, LabelledSandbox] = {}
        for kind in ("container", "network"):
            ids = await self._ids(kind, label)
            if not ids:
                continue
            try:
                described = json.loads(await docker(kind, "inspect", *ids))
            except EngineError:
                continue  # removed in between; the next look sees the rest
            for item in described:
                labels = (item.get("Config") or {}).get("Labels") if kind == "container" else None
                labels = labels or item.get("Labels") or {}
                project = labels.get(PROJECT_LABEL)
                if not project or any(name not in labels for name in LABELS):
                    continue
                found[project] = LabelledSandbox(
                    fleet=labels[FLEET_LABEL],
                    record=labels[RECORD_LABEL],
                    rollout=labels[ROLLOUT_LABEL],
                    execution=labels[EXECUTION_LABEL],
                    project=project,
                )
        return list(found.values())


_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _bytes(text: str) -> int:
    """``docker ps --size``'s human figure (``12.3MB``) in bytes."""
    match = re.fullmatch(r"([0-9.]+)\s*([kKMGT]?B)", text.strip())
    if match is None:
        return 0
    return int(float(match.group(1)) * _UNITS.get(match.group(2), 1))


def _copy_out(
    argv: list[str],
    target: Path,
    budget: CopyBudget,
    single: bool,
    started: list[subprocess.Popen[bytes]],
) -> None:
    """Run ``docker cp`` and read its tar stream into ``target`` (in a worker thread)."""
    with subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        started.append(process)
        try:
            _untar(process, target, budget, single)
        finally:
            if process.poll() is None:
                process.kill()


def _untar(
    process: subprocess.Popen[bytes], target: Path, budget: CopyBudget, single: bool
) -> None:
    """Read ``docker cp``'s tar stream into ``target``."""
    assert process.stdout is not None
    (target.parent if single else target).mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=process.stdout, mode="r|") as archive:
            for member in archive:
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                relative = parts if single else parts[1:]  # the copied folder's own name first
                if any(p == ".." for p in relative) or (not relative and not single):
                    continue
                if member.isdir():
                    (target.joinpath(*relative) if relative else target).mkdir(
                        parents=True, exist_ok=True
                    )
                    continue
                if not member.isfile():
                    continue  # links, devices, fifos: the sandbox made them
                budget.take("/".join(parts), member.size)
                destination = target if single else target.joinpath(*relative)
                destination.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                if source is not None:
                    _copy(source, destination)
    except tarfile.ReadError as exc:
        if process.wait() != 0:
            assert process.stderr is not None
            raise EngineError(f"docker cp failed: {_reason(process.stderr.read(4096))}") from None
        raise EngineError(f"docker cp gave no archive: {exc}") from None


def _copy(source: IO[bytes], destination: Path) -> None:
    with destination.open("wb") as out:
        while chunk := source.read(_CHUNK):
            out.write(chunk)


__all__ = [
    "BUILT_LABEL",
    "PROXIED",
    "BuildFailed",
    "CopyBudget",
    "DockerEngine",
    "EngineError",
    "LabelledSandbox",
    "OverBudget",
    "SandboxEngine",
    "docker",
]
