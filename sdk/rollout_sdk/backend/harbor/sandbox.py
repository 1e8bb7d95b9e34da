"""Who owns a sandbox, and the Docker engine calls that find and remove sandboxes.

Every container and network a trial creates belongs to one Compose project, named for the
trial. The trial's ``main`` container and its default network also carry the owner's labels
(:data:`LABELS`): which fleet, which rollout record and which execution holds its lease. The
backend removes its project when the trial ends however it ends; whoever finds a labelled
project whose execution no longer holds its rollout (a worker killed with ``kill -9``, a
frozen one whose lease moved on) removes it the same way: :func:`remove_project`.

The engine is reached with the ``docker`` CLI (as Harbor itself does), on ``DOCKER_HOST``,
from asyncio subprocesses, so nothing here blocks an event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LABEL_PREFIX = "org.rollout-fleet"
FLEET_LABEL = f"{LABEL_PREFIX}.fleet"
RECORD_LABEL = f"{LABEL_PREFIX}.record"
ROLLOUT_LABEL = f"{LABEL_PREFIX}.rollout"
EXECUTION_LABEL = f"{LABEL_PREFIX}.execution"
PROJECT_LABEL = "com.docker.compose.project"  # Compose sets it on everything it creates
LABELS = (FLEET_LABEL, RECORD_LABEL, ROLLOUT_LABEL, EXECUTION_LABEL)
TRIAL_PREFIX = "rfx-"
ENGINE_TIMEOUT_SECONDS = 60.0
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours in the CLI's errors


class EngineError(RuntimeError):
    """The Docker engine refused a call or could not be reached."""


@dataclass(frozen=True)
class SandboxOwner:
    """The execution a trial runs for: its labels, and the trial name derived from it."""

    fleet: str
    record: str
    rollout: str
    execution: str

    @property
    def trial_name(self) -> str:
        """Unique per execution, a valid Compose project name whatever the ids hold."""
        digest = hashlib.sha256(f"{self.fleet}\0{self.execution}".encode()).hexdigest()
        return f"{TRIAL_PREFIX}{digest[:20]}"

    def labels(self) -> dict[str, str]:
        return {
            FLEET_LABEL: self.fleet,
            RECORD_LABEL: self.record,
            ROLLOUT_LABEL: self.rollout,
            EXECUTION_LABEL: self.execution,
        }

    def overlay(self) -> dict[str, Any]:
        """A Compose file that labels the trial's main container and default network, and
        stops it at once: its ``sleep infinity`` runs as PID 1, which ignores SIGTERM, so
        every ``compose down`` (each trial's end, a cancel) would wait out Docker's 10 s."""
        labels = self.labels()
        return {
            "services": {"main": {"labels": labels, "stop_grace_period": "1s"}},
            "networks": {"default": {"labels": labels}},
        }


# Set by whoever runs the backend for a rollout (the fleet's worker); unset, a trial is
# labelled as this process's own (see HarborBackend).
current_owner: contextvars.ContextVar[SandboxOwner | None] = contextvars.ContextVar(
    "rollout_sandbox_owner", default=None
)


def write_overlay(owner: SandboxOwner, folder: Path, extra: dict[str, Any] | None = None) -> Path:
    """The trial's Compose overlay: the owner's labels, and ``extra`` (its egress) merged."""
    document = owner.overlay()
    for section, entries in (extra or {}).items():
        for name, body in entries.items():
            merged = document.setdefault(section, {}).setdefault(name, {})
            merged.update(body)
    path = folder / f"{owner.trial_name}.overlay.json"
    path.write_text(json.dumps(document))
    return path


def docker_cli() -> str:
    found = shutil.which("docker")
    if found is None:
        raise EngineError(
            "the docker CLI is not on PATH: install Docker's client (and its compose plugin) "
            "on every host that runs sandboxed rollouts"
        )
    return found


async def docker(*args: str, seconds: float = ENGINE_TIMEOUT_SECONDS) -> str:
    """Run ``docker <args>``; its stdout. One-line :class:`EngineError` on failure."""
    process = await asyncio.create_subprocess_exec(
        docker_cli(),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=os.environ.copy(),
    )
    try:
        async with asyncio.timeout(seconds):
            out, err = await process.communicate()
    except BaseException:
        with _quietly():
            process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        said = _ESCAPES.sub("", err.decode(errors="replace")).strip().splitlines()
        errors = [line for line in said if line.lstrip().upper().startswith("ERROR")]
        reason = (errors or said or ["no output"])[-1].strip()
        raise EngineError(f"docker {args[0]} failed: {reason}")
    return out.decode(errors="replace")


class _quietly:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is ProcessLookupError


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


async def _ids(kind: str, label: str) -> list[str]:
    if kind == "container":
        return _lines(await docker("ps", "-aq", "--no-trunc", "--filter", f"label={label}"))
    return _lines(await docker(kind, "ls", "-q", "--filter", f"label={label}"))


async def remove_project(project: str) -> int:
    """Remove every container, network and volume of one Compose project (a trial's
    environment, or its separate verifier's); how many objects went. Idempotent."""
    label = f"{PROJECT_LABEL}={project}"
    removed = 0
    containers = await _ids("container", label)
    if containers:
        await docker("rm", "-f", "-v", *containers)
        removed += len(containers)
    for kind in ("network", "volume"):
        found = await _ids(kind, label)
        if found:
            await docker(kind, "rm", *found)
            removed += len(found)
    return removed


async def trial_projects(trial_name: str) -> list[str]:
    """The Compose projects of one trial (Harbor names them ``<trial>__env`` and so on)."""
    text = await docker(
        "ps",
        "-a",
        "--filter",
        f"label={PROJECT_LABEL}",
        "--format",
        '{{.Label "' + PROJECT_LABEL + '"}}',
    )
    networks = await docker(
        "network",
        "ls",
        "--filter",
        f"label={PROJECT_LABEL}",
        "--format",
        '{{.Label "' + PROJECT_LABEL + '"}}',
    )
    found = {p for p in _lines(text) + _lines(networks)}
    stem = trial_name.lower()
    return sorted(
        p for p in found if p == stem or p.startswith(f"{stem}__") or p.startswith(f"{stem}_")
    )


async def remove_trial(trial_name: str) -> int:
    removed = 0
    for project in await trial_projects(trial_name):
        removed += await remove_project(project)
    return removed


@dataclass(frozen=True)
class LabelledSandbox:
    """One trial's labelled objects, as the engine lists them."""

    fleet: str
    record: str
    rollout: str
    execution: str
    project: str


async def labelled_sandboxes(fleet: str) -> list[LabelledSandbox]:
    """Every trial of ``fleet`` the engine holds a labelled container or network of (read
    with ``inspect``: ids may hold any character, commas included)."""
    label = f"{FLEET_LABEL}={fleet}"
    found: dict[str, LabelledSandbox] = {}
    for kind in ("container", "network"):
        ids = await _ids(kind, label)
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


async def image_exists(tag: str) -> bool:
    try:
        await docker("image", "inspect", "--format", "{{.Id}}", tag)
    except EngineError:
        return False
    return True


__all__ = [
    "EXECUTION_LABEL",
    "FLEET_LABEL",
    "LABELS",
    "PROJECT_LABEL",
    "RECORD_LABEL",
    "ROLLOUT_LABEL",
    "EngineError",
    "LabelledSandbox",
    "SandboxOwner",
    "current_owner",
    "docker",
    "image_exists",
    "labelled_sandboxes",
    "remove_project",
    "remove_trial",
    "write_overlay",
]
