"""A user's ``AgentWorkflow`` (and ``Grader``) packed for the sandbox.

The sandbox image is the task's image plus one layer: a virtual environment at
:data:`VENV` holding the SDK's dependencies as the fleet's lock pins them and the user
project's, installed from wheels the worker fetched (``layer.py``) with no network at all
(a build's ``RUN`` could otherwise reach whatever the engine's network does), the SDK's own
files and the user's ``code_dir``. The layer's tag is a hash of all of it, so it is built
once per task, code and SDK, and reused by every trial and worker on the engine.

Objects are named for the sandbox by import path (``package.module:attribute``) relative to
``code_dir``, which goes on ``PYTHONPATH`` there (its ``src/`` too, if it has one).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

import rollout_sdk

ROOT = "/opt/rollout-sandbox"
VENV = f"{ROOT}/venv"
PYTHON = f"{VENV}/bin/python"
SITE = f"{ROOT}/sdk"
CODE = f"{ROOT}/code"
PYTHONPATH = f"{SITE}:{CODE}:{CODE}/src"
# Upstream's package and ours stand for the SDK copied in; their extras for our extras.
SDK_NAMES = {"osmosis-ai", "rollout-sdk"}
SKIPPED = {"__pycache__", ".venv", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


class PackingError(ValueError):
    """An object the sandbox cannot import, or a project it cannot install."""


def import_path(obj: Any, code_dir: Path, what: str) -> str | None:
    """``module:attribute`` naming ``obj`` inside the sandbox, or None for None."""
    if obj is None:
        return None
    if isinstance(obj, str):
        return obj
    target = obj if inspect.isclass(obj) else type(obj)
    module = sys.modules.get(target.__module__ if inspect.isclass(obj) else _module_of(obj))
    source = getattr(module, "__file__", None)
    if module is None or source is None:
        raise PackingError(f"{what}: cannot tell which file defines {obj!r}")
    path = Path(source).resolve()
    dotted = _module_name(path, code_dir)
    if dotted is None:
        raise PackingError(
            f"{what} {obj!r} is defined in {path}, outside code_dir={code_dir}: the sandbox "
            "gets only code_dir; move it there or set code_dir to a folder holding it"
        )
    attribute = obj.__qualname__ if inspect.isclass(obj) else _binding(module, obj, what, path)
    return f"{dotted}:{attribute}"


def _module_of(obj: Any) -> str:
    """The module holding an instance (a config) at module level: the module of its class
    when that holds it (configs sit beside their class; an entry point that imports one also
    holds it, but may import what the sandbox lacks, Harbor itself), else any holder."""
    own = str(type(obj).__module__)
    holders = [
        name
        for name, module in list(sys.modules.items())
        if any(value is obj for value in vars(module).values() if not isinstance(value, type))
    ]
    return own if own in holders or not holders else holders[0]


def _binding(module: Any, obj: Any, what: str, path: Path) -> str:
    for name, value in vars(module).items():
        if value is obj:
            return str(name)
    raise PackingError(f"{what} {obj!r} is not a module-level name in {path}")


def _module_name(path: Path, code_dir: Path) -> str | None:
    for root in (code_dir / "src", code_dir):
        try:
            relative = path.relative_to(root.resolve())
        except ValueError:
            continue
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts) if parts else None
    return None


@dataclass(frozen=True)
class Declared:
    """What a project's ``pyproject.toml`` asks the sandbox for: the SDK's extras
    (``osmosis-ai[x]`` / ``rollout-sdk[x]`` stand for the SDK copied in, with its extra
    ``x``) and its other requirements as written."""

    extras: frozenset[str]
    project: tuple[str, ...]

    def text(self) -> str:
        return "\n".join([",".join(sorted(self.extras)), *self.project])


def declared(code_dir: Path) -> Declared:
    """The project's requirements; a :class:`PackingError` when they cannot be read."""
    wanted: set[str] = set()
    project: list[str] = []
    pyproject = code_dir / "pyproject.toml"
    if pyproject.is_file():
        try:
            found = tomllib.loads(pyproject.read_text()).get("project", {})
        except tomllib.TOMLDecodeError as exc:
            raise PackingError(f"{pyproject} is not valid TOML: {exc}") from None
        for text in found.get("dependencies", []):
            try:
                requirement = Requirement(text)
            except InvalidRequirement as exc:
                raise PackingError(f"{pyproject}: dependency {text!r} is invalid: {exc}") from None
            if canonicalize_name(requirement.name) in SDK_NAMES:
                wanted |= requirement.extras
            else:
                project.append(text)
    return Declared(frozenset(wanted), tuple(project))


@dataclass(frozen=True)
class SandboxWorkflow:
    """The workflow, its config, grader and grader config as the sandbox imports them."""

    workflow: str
    workflow_config: str | None
    grader: str | None
    grader_config: str | None
    code_dir: Path

    @classmethod
    def of(
        cls, workflow: Any, workflow_config: Any, grader: Any, grader_config: Any, code_dir: Path
    ) -> SandboxWorkflow:
        found = import_path(workflow, code_dir, "agent")
        assert found is not None
        return cls(
            workflow=found,
            workflow_config=import_path(workflow_config, code_dir, "workflow_config"),
            grader=import_path(grader, code_dir, "grader"),
            grader_config=import_path(grader_config, code_dir, "grader_config"),
            code_dir=code_dir,
        )

    def content_hash(self) -> str:
        """What the sandbox layer is made of: the SDK's files, the code and what it needs."""
        from rollout_sdk.backend.harbor.tasks import content_hash

        sdk = content_hash(Path(rollout_sdk.__file__).parent)  # the locked pins included
        code = content_hash(self.code_dir)
        wanted = declared(self.code_dir).text().encode()
        return hashlib.sha256(f"{sdk}\0{code}\0".encode() + wanted).hexdigest()

    def write_context(self, folder: Path, base: str, wheels: list[Path], pins: str) -> None:
        """A build context for the sandbox layer on top of image ``base``: ``wheels`` (linked
        in) and ``pins`` (every requirement pinned with its hashes) install with no index.
        The wheels stay in a first stage: the image gets the environment, not its sources."""
        sdk = Path(rollout_sdk.__file__).parent
        shutil.copytree(sdk, folder / "sdk" / "rollout_sdk", ignore=_skip)
        shutil.copytree(self.code_dir, folder / "code", ignore=_skip, symlinks=False)
        (folder / "wheels").mkdir()
        for wheel in wheels:
            try:
                os.link(wheel, folder / "wheels" / wheel.name)
            except OSError:  # another filesystem
                shutil.copyfile(wheel, folder / "wheels" / wheel.name)
        (folder / "requirements.txt").write_text(pins)
        (folder / "Dockerfile").write_text(
            f"FROM {base} AS environment\n"
            f"COPY wheels {ROOT}/wheels\n"
            f"COPY requirements.txt {ROOT}/requirements.txt\n"
            f"RUN python3 -m venv {VENV} && {VENV}/bin/pip install --no-cache-dir "
            f"--disable-pip-version-check -q --no-index --find-links {ROOT}/wheels "
            f"--require-hashes -r {ROOT}/requirements.txt\n"
            f"FROM {base}\n"
            f"COPY --from=environment {VENV} {VENV}\n"
            f"COPY requirements.txt {ROOT}/requirements.txt\n"
            f"COPY sdk {SITE}\n"
            f"COPY code {CODE}\n"
        )

    def grading_script(self) -> str:
        """``tests/test.sh`` when the Grader is the verifier."""
        return (
            "#!/bin/sh\n"
            f"PYTHONPATH={PYTHONPATH} exec {PYTHON} -m rollout_sdk.backend.harbor.in_sandbox "
            "grade\n"
        )


def _skip(folder: str, names: list[str]) -> set[str]:
    return {name for name in names if name in SKIPPED or name.endswith(".pyc")}


__all__ = [
    "PYTHON",
    "PYTHONPATH",
    "ROOT",
    "VENV",
    "Declared",
    "PackingError",
    "SandboxWorkflow",
    "declared",
]
