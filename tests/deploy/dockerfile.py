"""What a Dockerfile's final stage gives a container (:class:`Image`), read from the file for
the static checks; tests/docker/ builds and runs the images for real."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path


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
