"""Which Harbor task a rollout runs, and the prepared copy whose image is built once.

A task is a folder: ``task.toml``, ``instruction.md``, ``environment/Dockerfile`` (or a
``docker_image`` in ``task.toml``), ``tests/test.sh``. ``template`` mode runs every rollout
on the one task in ``tasks_dir``; ``dataset`` mode picks ``tasks_dir/<metadata["harbor_task_id"]>``;
``metadata["harbor_task"]`` names a task folder for one rollout: a path, which must lie under
``tasks_dir`` or a root the operator named (``ROLLOUT_FLEET_SANDBOX_TASK_ROOTS``), or a git
checkout (``metadata["git_url"]``) from a host the operator allowed
(``ROLLOUT_FLEET_SANDBOX_TASK_HOSTS``, none by default). A rollout's metadata comes from the
trainer's dataset: it never picks a folder or a host the operator did not.

Images: Harbor builds a task's image for every trial and removes it with the trial. Here the
image is built once per task content and tagged with its hash (``rollout-fleet-sandbox/<name>:
<hash>``); trials run a prepared copy of the task that names that image, so every trial and
every worker on the engine reuses it.

Instructions: Harbor refuses a task without ``instruction.md``, and upstream's template mode
writes it from the rollout's prompt (the messages as JSON) in a copy made per rollout. A
workflow never reads it (our harness hands it the rollout itself), so its prepared copy gets
a fixed one when the task has none. A Harbor agent reads it: :meth:`PreparedTasks.instructed`
makes the trial's own copy with the rollout's prompt, so no rollout sees another's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import string
import tempfile
import tomllib
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rollout_sdk.backend.harbor.egress import build_relay
from rollout_sdk.backend.harbor.engine import PROXIED, DockerEngine
from rollout_sdk.backend.harbor.layer import LayerWheels
from rollout_sdk.backend.harbor.policy import PolicyRefusal, SandboxPolicy, check_dockerfile
from rollout_sdk.backend.harbor.workflows import PackingError, SandboxWorkflow, declared

logger = logging.getLogger(__name__)

IMAGE_REPOSITORY = "rollout-fleet-sandbox"
INSTRUCTION = "instruction.md"
# A workflow's task without an instruction: Harbor needs the file, the workflow reads the
# rollout's prompt from the rollout itself.
WORKFLOW_INSTRUCTION = "The rollout's prompt is handed to its workflow directly.\n"
TRIAL_TASK = "task"  # the trial's own copy of its task, in the trial's folder
_TAG_CHARACTERS = frozenset(string.ascii_lowercase + string.digits + "._-")


class TaskMode(StrEnum):
    TEMPLATE = "template"
    DATASET = "dataset"


class TaskError(ValueError):
    """A rollout names no task, or one that does not exist."""


class UninstallableProject(PackingError, TaskError):
    """The workflow's project cannot be installed in the task's sandbox (its dependencies do
    not resolve against the fleet's lock, or have no wheel for the task's Python): the
    user's to fix, so a rollout ends with it as a validation error."""


@dataclass(frozen=True)
class TaskSources:
    """Where a rollout's own task may come from, beside ``tasks_dir``: folders (resolved,
    links followed) and git hosts, as the operator named them."""

    roots: tuple[Path, ...] = ()
    git_hosts: frozenset[str] = frozenset()

    def folder(self, path: Path, tasks_dir: Path) -> Path:
        resolved = path.resolve()
        for root in (tasks_dir, *self.roots):
            if resolved.is_relative_to(root.resolve()):
                return resolved
        raise TaskError(
            f"metadata['harbor_task'] names {path}, outside tasks_dir and the task roots: a "
            "rollout runs only tasks under the folders the operator named "
            "(ROLLOUT_FLEET_SANDBOX_TASK_ROOTS)"
        )

    def git_url(self, url: str) -> str:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme != "https" or not host or host not in self.git_hosts:
            raise TaskError(
                f"metadata['git_url'] names {parts.scheme or '?'}://{host or '?'}, not an https "
                "host the operator allowed (ROLLOUT_FLEET_SANDBOX_TASK_HOSTS, none by default)"
            )
        return url


def task_folder(
    tasks_dir: Path,
    mode: TaskMode,
    metadata: dict[str, Any] | None,
    sources: TaskSources = TaskSources(),
) -> Path | str:
    """The task folder a rollout runs, or a reference for Harbor's task client (a git
    checkout from an allowed host)."""
    metadata = metadata or {}
    reference = metadata.get("harbor_task")
    if reference:
        reference = str(reference)
        if metadata.get("git_url"):
            sources.git_url(str(metadata["git_url"]))
            return reference
        if not reference.startswith((".", "/", "~")):
            raise TaskError(
                f"metadata['harbor_task']={reference!r} names a registry package, which this "
                "fleet does not fetch: give a path under tasks_dir or a task root (./, /), or "
                "a git checkout from an allowed host (metadata['git_url'])"
            )
        path = Path(reference).expanduser()
        if not path.is_absolute():
            path = tasks_dir / path
        return _checked(sources.folder(path, tasks_dir), "metadata['harbor_task']")
    if mode is TaskMode.TEMPLATE:
        return _checked(tasks_dir, "tasks_dir")
    task_id = metadata.get("harbor_task_id")
    if not task_id:
        raise TaskError(
            "dataset mode needs metadata['harbor_task_id'] (a folder in tasks_dir) or "
            "metadata['harbor_task'] on every row"
        )
    if "/" in str(task_id) or "\\" in str(task_id) or str(task_id) in (".", ".."):
        raise TaskError(f"metadata['harbor_task_id']={task_id!r} must be one folder name")
    return _checked(
        sources.folder(tasks_dir / str(task_id), tasks_dir), "metadata['harbor_task_id']"
    )


def _checked(path: Path, source: str) -> Path:
    if not (path / "task.toml").is_file() and not (path / "instruction.md").is_file():
        raise TaskError(f"{source} names {path}, which is no Harbor task folder (no task.toml)")
    return path


TASK_CAP_BYTES = 2 * 2**30  # a task folder the fleet reads to hash and copy


def content_hash(folder: Path, *extra: bytes, cap: int = TASK_CAP_BYTES) -> str:
    """A hash of every file's path, mode and bytes under ``folder`` (and ``extra``), read in
    chunks; a link counts as its target's text, never followed. Over ``cap`` bytes in all:
    :class:`TaskError`."""
    digest = hashlib.sha256()
    skipped = {"__pycache__", ".venv", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    found = (
        p
        for p in folder.rglob("*")
        if (p.is_symlink() or p.is_file())
        and p.suffix != ".pyc"
        and not skipped & set(p.relative_to(folder).parts)
    )
    total = 0
    for path in sorted(found):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_symlink():
            digest.update(b"\0l" + os.readlink(path).encode())
            continue
        digest.update(b"\0x" if path.stat().st_mode & 0o111 else b"\0-")
        with path.open("rb") as source:
            while chunk := source.read(2**20):
                total += len(chunk)
                if total > cap:
                    raise TaskError(
                        f"{folder.name} holds more than {cap // 2**20} MB of files: a task folder "
                        "is copied for its trials, keep large data in its image"
                    )
                digest.update(chunk)
        digest.update(b"\0")
    for part in extra:
        digest.update(part)
    return digest.hexdigest()


def _image_name(task: Path) -> str:
    """A valid image name for any folder name: ASCII letters, digits and ``._-`` only (a
    folder named in another script becomes ``task``; the tag's hash tells tasks apart)."""
    kept = (c if c in _TAG_CHARACTERS else "-" for c in task.name.lower())
    name = re.sub(r"-{2,}", "-", "".join(kept)).strip(".-_")[:64].strip(".-_")
    return name or "task"


class PreparedTasks:
    """Prepared copies of tasks, each naming its image, built at most once per content."""

    def __init__(
        self,
        root: Path,
        engine: DockerEngine,
        build_network: str = "none",
        build_hosts: frozenset[str] = frozenset(),
        registries: frozenset[str] = frozenset(),
    ) -> None:
        self.root = root
        self.engine = engine
        self.build_network = build_network  # none: a task's RUN reaches nothing
        self.build_hosts = build_hosts  # beside the internet, for a proxied build
        self.registries = registries  # a base image may name these registry hosts
        self.layers = LayerWheels(root.parent / "layers")
        self._locks: dict[str, asyncio.Lock] = {}

    def _labels(self, task: Path) -> dict[str, str]:
        return {"org.rollout-fleet.task": _image_name(task)}

    async def prepare(self, task: Path, layer: SandboxWorkflow | None = None) -> Path:
        """The prepared copy of ``task`` whose image exists on the engine: the task's own
        image, or with ``layer`` that image plus the user's workflow (and, when the task has
        no ``tests/test.sh``, the grader as its verifier). A :class:`UninstallableProject`
        when the workflow's project cannot be installed there."""
        key = await asyncio.to_thread(content_hash, task)
        tag = f"{IMAGE_REPOSITORY}/{_image_name(task)}:{key[:16]}"
        image = tag
        grading = None
        if layer is not None:
            try:  # the project's pyproject.toml is read here
                packed = await asyncio.to_thread(layer.content_hash)
            except PackingError as exc:
                raise UninstallableProject(str(exc)) from None
            key = hashlib.sha256(f"{key}\0{packed}".encode()).hexdigest()
            image = f"{IMAGE_REPOSITORY}/{_image_name(task)}-workflow:{key[:16]}"
            if layer.grader and not (task / "tests" / "test.sh").is_file():
                grading = layer.grading_script()
        copy = self.root / key[:16] / task.name
        instruction = WORKFLOW_INSTRUCTION if layer is not None else None
        async with self._locks.setdefault(key, asyncio.Lock()):
            if not (copy / "task.toml").is_file():
                await asyncio.to_thread(_copy_naming_image, task, copy, image, grading, instruction)
            # Checked at every rollout, not only when the copy was made: a copy kept from a
            # fleet before a rule was added is held to it too.
            await asyncio.to_thread(_check_task, task, self.registries)
            if not await self.engine.image_exists(tag):
                await self._build(task, tag)
            if layer is not None and not await self.engine.image_exists(image):
                try:
                    await self._build_layer(layer, tag, image)
                except PackingError as exc:
                    raise UninstallableProject(str(exc)) from None
        return copy

    async def instructed(self, prepared: Path, trial_dir: Path, prompt: list[Any]) -> Path:
        """The trial's own copy of ``prepared`` (in ``trial_dir``, removed with it) whose
        ``instruction.md`` is the rollout's prompt as upstream writes it in template mode;
        ``prepared`` itself when the rollout has no prompt and the task has an instruction.
        The copy links the prepared files and writes only the instruction anew, so it costs
        one folder of links per trial and leaves ``prepared`` as it was (the policy mounts a
        task's files read-only, so a sandbox never writes through a link)."""
        if not prompt:
            if not (prepared / INSTRUCTION).is_file():
                raise TaskError(
                    f"task {prepared.name} has no {INSTRUCTION} and the rollout has no prompt: "
                    f"give the task an {INSTRUCTION}, or the rollout a prompt"
                )
            return prepared
        text = json.dumps(prompt, default=str)
        return await asyncio.to_thread(_instructed_copy, prepared, trial_dir / TRIAL_TASK, text)

    async def _build_layer(self, layer: SandboxWorkflow, base: str, image: str) -> None:
        """The workflow's layer on ``base``: its wheels fetched here, then built with no
        network at all (the build installs from the wheels in its context)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        wanted = await asyncio.to_thread(declared, layer.code_dir)
        target = await self.layers.target(base)
        fetched = await self.layers.fetch(wanted, target)
        wheels_took = loop.time() - started
        await asyncio.to_thread(self.root.parent.mkdir, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".layer-", dir=self.root.parent) as folder:
            await asyncio.to_thread(
                layer.write_context, Path(folder), base, fetched.wheels, fetched.pins
            )
            await self.engine.build(
                Path(folder), image, network="none", labels=self._labels(layer.code_dir)
            )
        logger.info(
            "sandbox image %s (with the workflow) ready in %.1fs: %d wheels, %.1f MB, %.1fs of "
            "it to have them (%s)",
            image, loop.time() - started, len(fetched.wheels), fetched.bytes / 1e6, wheels_took,
            target.describe(),
        )  # fmt: skip

    async def _build(self, task: Path, tag: str) -> None:
        configured = _task_config(task).get("environment", {}).get("docker_image")
        environment = task / "environment"
        started = asyncio.get_running_loop().time()
        if (environment / "Dockerfile").is_file():
            proxy = None
            if self.build_network == PROXIED:
                proxy = (await build_relay(self.engine), self.build_hosts)
            await self.engine.build(
                environment,
                tag,
                network=self.build_network,
                labels=self._labels(task),
                proxy=proxy,
            )
        elif configured:
            await self.engine.tag(str(configured), tag)
        else:
            raise TaskError(f"{task} has neither environment/Dockerfile nor a docker_image")
        took = asyncio.get_running_loop().time() - started
        logger.info("sandbox image %s ready in %.1fs", tag, took)


def _drop_links_out(folder: Path) -> None:
    """Remove links that lead out of the copy: a task's compose file may bind-mount its own
    files, and a link would take the mount anywhere on the engine's host."""
    root = folder.resolve()
    for path in list(folder.rglob("*")):
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            path.unlink()


def _check_task(task: Path, registries: frozenset[str]) -> None:
    """What a task declares that would reach out of its box: ``${VAR}`` in its ``task.toml``
    (the worker's environment), a base image or ``ADD`` URL its Dockerfile has the engine
    fetch."""
    _refuse_host_values(_task_config(task), task.name)
    dockerfile = task / "environment" / "Dockerfile"
    if dockerfile.is_file():
        with dockerfile.open("rb") as source:
            text = source.read(2**20).decode(errors="replace")
        try:
            check_dockerfile(text, SandboxPolicy(registries=registries), task.name)
        except PolicyRefusal as exc:
            raise TaskError(str(exc)) from None


def _refuse_host_values(value: Any, task: str, where: str = "task.toml") -> None:
    """A task's ``task.toml`` never reads the worker's environment: Harbor fills ``${VAR}``
    (its ``[environment.env]``, ``[verifier.env]``, ``[solution.env]``...) from the process
    that runs the trial, which holds the fleet's keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_host_values(item, task, f"{where} {key}")
    elif isinstance(value, list):
        for item in value:
            _refuse_host_values(item, task, where)
    elif isinstance(value, str) and "${" in value:
        raise TaskError(
            f"task {task}: {where} reads the worker's environment (${{...}}), which a task may "
            "not: write the value itself"
        )


def _task_config(task: Path) -> dict[str, Any]:
    path = task / "task.toml"
    return tomllib.loads(path.read_text()) if path.is_file() else {}


def _copy_naming_image(
    task: Path, copy: Path, tag: str, grading: str | None, instruction: str | None
) -> None:
    """Write the copy beside its place and rename it there: other workers on this host may
    prepare the same task at the same time, and the first rename wins."""
    copy.parent.mkdir(parents=True, exist_ok=True)
    staging = copy.with_name(f".{copy.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    shutil.copytree(task, staging, symlinks=True)
    _drop_links_out(staging)
    config = _task_config(task)
    _refuse_host_values(config, task.name)
    config.setdefault("environment", {})["docker_image"] = tag
    import toml  # Harbor's own dependency, as Harbor writes task files with it

    # With docker_image set Harbor runs that image and builds nothing.
    (staging / "task.toml").write_text(toml.dumps(config))
    if grading is not None:
        tests = staging / "tests"
        tests.mkdir(exist_ok=True)
        (tests / "test.sh").write_text(grading)
        (tests / "test.sh").chmod(0o755)
    if instruction is not None and not (staging / INSTRUCTION).is_file():
        (staging / INSTRUCTION).write_text(instruction)
    try:
        staging.rename(copy)
    except OSError:  # another process's copy is in place (the same content)
        shutil.rmtree(staging, ignore_errors=True)


def _instructed_copy(prepared: Path, copy: Path, instruction: str) -> Path:
    """``prepared`` linked file by file into ``copy``, with ``instruction`` as its own
    (written to a new file: the link would write through to ``prepared``)."""
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(prepared, copy, symlinks=True, copy_function=_link_or_copy)
    target = copy / INSTRUCTION
    staging = copy / f".{INSTRUCTION}.new"
    staging.write_text(instruction)
    os.replace(staging, target)
    return copy


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another filesystem
        shutil.copy2(source, destination)


__all__ = [
    "IMAGE_REPOSITORY",
    "PreparedTasks",
    "TaskError",
    "TaskMode",
    "TaskSources",
    "UninstallableProject",
    "task_folder",
]
