"""What a Dockerfile's target gives a container (:class:`Image`: its stage and the stages it
is built on), read from the file for the static checks; tests/docker/ builds and runs the
images for real."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stage:
    """One ``FROM base [AS name]`` and its instructions, as (INSTRUCTION, arguments)."""

    base: str
    name: str | None
    steps: list[tuple[str, str]]


def stages(dockerfile: Path) -> list[Stage]:
    """The file's stages, in order."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    found = []
    for stage in re.split(r"(?m)^FROM\s", text)[1:]:
        header, *rest = stage.splitlines()
        base, _, name = re.sub(r"(?i)\s+as\s+", " AS ", header.strip()).partition(" AS ")
        lines = [line.strip() for line in rest]
        steps = [line.partition(" ") for line in lines if line and not line.startswith("#")]
        instructions = [(instruction.upper(), args) for instruction, _, args in steps]
        found.append(Stage(base.strip(), name.strip() or None, instructions))
    return found


def lineage(dockerfile: Path, target: str | None = None) -> list[Stage]:
    """The stages an image is made of, the first on an image, the last ``target`` (the
    file's last stage, its default target, when None)."""
    named = stages(dockerfile)
    by_name = {stage.name: stage for stage in named if stage.name}
    stage = by_name[target] if target else named[-1]
    chain = [stage]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    return chain


def env_pairs(arguments: str) -> dict[str, str]:
    """``ENV A=1 B=2`` → ``{"A": "1", "B": "2"}``."""
    pairs = (pair.partition("=") for pair in shlex.split(arguments))
    return {name: value for name, _, value in pairs}


@dataclass(frozen=True)
class Image:
    """What a Dockerfile's target (by default its last stage) gives a container."""

    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    workdir: str

    @classmethod
    def from_dockerfile(cls, path: Path, target: str | None = None) -> Image:
        env: dict[str, str] = {}
        entrypoint: list[str] = []
        cmd: list[str] = []
        workdir = "/"
        steps = [step for stage in lineage(path, target) for step in stage.steps]
        for instruction, rest in steps:
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
