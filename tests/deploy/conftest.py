"""A project folder configured the way a user would: ``docker-compose.yml`` and a ``.env``
made from ``.env.example``, for the Compose CLI's static checks."""

from __future__ import annotations

from pathlib import Path

from tests.harness import REPO

# A user's checkout: everything in the repo but local state.
NOT_IN_A_CHECKOUT = {".env", ".git", ".venv", "test-output", ".mypy_cache", ".ruff_cache"}


def env_file(overrides: dict[str, str]) -> str:
    """``.env.example`` with these values set (added when the example lacks them)."""
    lines, missing = [], dict(overrides)
    for line in (REPO / ".env.example").read_text().splitlines():
        name = line.split("=", 1)[0]
        lines.append(f"{name}={missing.pop(name)}" if "=" in line and name in missing else line)
    return "\n".join([*lines, *(f"{k}={v}" for k, v in missing.items())]) + "\n"


def project(root: Path, overrides: dict[str, str], compose_file: str | None = None) -> Path:
    """A checkout to run compose in: the repo's files (linked), a fresh ``.env`` and,
    optionally, another ``docker-compose.yml``."""
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name in NOT_IN_A_CHECKOUT or entry.name.startswith(".pytest"):
            continue
        if entry.name == "docker-compose.yml" and compose_file is not None:
            (root / entry.name).write_text(compose_file)
        else:
            (root / entry.name).symlink_to(entry)
    (root / ".env").write_text(env_file(overrides))
    return root
