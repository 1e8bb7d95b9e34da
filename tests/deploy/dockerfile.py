"""Dockerfiles without a Docker engine: what an image's final stage gives a container
(:class:`Image`), and its build stage run on this machine (:class:`ImageBuilder`), so the
compose-as-processes stack runs the virtualenv the image would ship, not the test suite's.

The build context is what ``.dockerignore`` lets through; each ``COPY`` of the stage copies
from it (a source the ignore file excludes fails, as ``docker build`` would), each ``ENV``
and ``WORKDIR`` applies, each ``RUN`` runs under ``sh``. The one ``COPY --from`` of the stage,
the uv binary, is played by the ``uv`` on ``PATH``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

HOST_ONLY = {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME"}


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """Each stage's instructions after its ``FROM``, as (INSTRUCTION, arguments)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    found = []
    for stage in re.split(r"(?m)^FROM\s", text)[1:]:
        lines = [line.strip() for line in stage.splitlines()[1:]]
        steps = [line.partition(" ") for line in lines if line and not line.startswith("#")]
        found.append([(instruction.upper(), rest) for instruction, _, rest in steps])
    return found


def env_pairs(arguments: str) -> dict[str, str]:
    """``ENV A=1 B=2`` → ``{"A": "1", "B": "2"}``."""
    pairs = (pair.partition("=") for pair in shlex.split(arguments))
    return {name: value for name, _, value in pairs}


@dataclass(frozen=True)
class Image:
    """What a Dockerfile's final stage gives a container."""

    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    workdir: str

    @classmethod
    def from_dockerfile(cls, path: Path) -> Image:
        env: dict[str, str] = {}
        entrypoint: list[str] = []
        cmd: list[str] = []
        workdir = "/"
        for instruction, rest in stages(path)[-1]:
            match instruction:
                case "ENV":
                    env |= env_pairs(rest)
                case "ENTRYPOINT":
                    entrypoint = json.loads(rest)
                case "CMD":
                    cmd = json.loads(rest)
                case "WORKDIR":
                    workdir = rest.strip()
        return cls(env, entrypoint, cmd, workdir)


NO_IMAGE = Image({}, [], [], "/")


@dataclass(frozen=True)
class DockerIgnore:
    rules: list[str]

    @classmethod
    def read(cls, context: Path) -> DockerIgnore:
        lines = (context / ".dockerignore").read_text().splitlines()
        return cls([line.strip() for line in lines if line.strip() and line[0] != "#"])

    def excludes(self, relative: str) -> bool:
        """Docker's rule: the last matching pattern wins; a pattern also covers what is under
        the folder it matches."""
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for rule in self.rules:
            pattern = rule.removeprefix("!").rstrip("/")
            if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
                excluded = not rule.startswith("!")
        return excluded


class ImageBuilder:
    """Builds (once per distinct build stage) the virtualenv a Dockerfile's image ships."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    def venv(self, dockerfile: Path, context: Path) -> Path:
        steps = stages(dockerfile)[0]
        root = self.workspace / hashlib.sha256(repr(steps).encode()).hexdigest()[:12]
        workdir = root / "app"
        if not root.exists():
            self._run(steps, context, root)
        return workdir / ".venv"

    def _run(self, steps: list[tuple[str, str]], context: Path, root: Path) -> None:
        ignore = DockerIgnore.read(context)
        # docker build gives RUN the network; here that may take the host's proxy, certificate
        # and package-index settings. Nothing may point uv at the test suite's environment.
        env = {k: v for k, v in os.environ.items() if k not in HOST_ONLY}
        cwd = root
        for instruction, rest in steps:
            step = f"{instruction} {rest}"
            match instruction:
                case "ENV":
                    env |= env_pairs(rest)
                case "WORKDIR":
                    cwd = root / rest.strip().lstrip("/")
                    cwd.mkdir(parents=True, exist_ok=True)
                case "COPY" if rest.startswith("--from="):
                    assert "astral-sh/uv" in rest, f"unexpected build input: {step}"
                case "COPY":
                    *sources, target = shlex.split(rest)
                    into_folder = target.endswith("/") or len(sources) > 1
                    for source in sources:
                        self._copy(context, source, cwd / target, into_folder, ignore)
                case "RUN":
                    subprocess.run(["sh", "-c", rest], cwd=cwd, env=env, check=True)
                case other:
                    raise AssertionError(f"the build emulation does not know {other}: {step}")

    @staticmethod
    def _copy(
        context: Path, source: str, target: Path, into_folder: bool, ignore: DockerIgnore
    ) -> None:
        if ignore.excludes(source):
            raise AssertionError(f"COPY {source}: excluded from the build context")
        origin = context / source
        if origin.is_dir():
            shutil.copytree(
                origin,
                target,
                ignore=lambda folder, names: [
                    name
                    for name in names
                    if ignore.excludes(str((Path(folder) / name).relative_to(context)))
                ],
                dirs_exist_ok=True,
            )
        else:
            destination = target / origin.name if into_folder else target
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, destination)
