"""Write the SDK's locked requirements for workflow sandboxes, exported from ``uv.lock``.

A workflow's sandbox layer installs exactly what the fleet's lock holds (docs/SANDBOXES.md):
``sdk/rollout_sdk/backend/harbor/locked/sdk.txt`` is the SDK's own dependencies, and
``<extra>.txt`` those with one extra more, each pinned with the lock's hashes. Run after
``uv lock``::

    uv run python scripts/sandbox_requirements.py

``sdk/tests/test_sandbox_requirements.py`` fails while the files are stale against the lock.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCKED = REPO / "sdk" / "rollout_sdk" / "backend" / "harbor" / "locked"


def extras() -> list[str]:
    """The SDK's extras, ``all`` (their union) aside."""
    declared = tomllib.loads((REPO / "sdk" / "pyproject.toml").read_text())["project"]
    return sorted(name for name in declared["optional-dependencies"] if name != "all")


def export(extra: str | None) -> str:
    """uv's export of the lock for the SDK with ``extra``: pins and hashes, nothing else."""
    argv = ["uv", "export", "--frozen", "--no-dev", "--package", "rollout-sdk"]
    argv += ["--no-emit-project", "--no-header", "--no-annotate", "--format", "requirements-txt"]
    if extra is not None:
        argv += ["--extra", extra]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"uv export failed: {done.stderr.strip()}")
    return done.stdout


def expected() -> dict[str, str]:
    """File name → what it should hold now."""
    files = {"sdk.txt": export(None)}
    files.update({f"{extra}.txt": export(extra) for extra in extras()})
    return files


def main() -> int:
    LOCKED.mkdir(parents=True, exist_ok=True)
    wanted = expected()
    for stale in LOCKED.glob("*.txt"):
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        (LOCKED / name).write_text(text)
    print(f"wrote {len(wanted)} files in {LOCKED.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
