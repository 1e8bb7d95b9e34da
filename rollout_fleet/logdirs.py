"""Where ``rollout-fleet up`` keeps each run's logs (and its own Redis's data), and how many.

Each run gets a folder ``<tmp>/rollout-fleet-up-<uid>/<YYYYmmdd-HHMMSS>-<pid>``; ``up`` prints
it. A newcomer starts ``up`` many times in a first hour, and the folders must not pile up:
each new run keeps the newest :data:`KEEP` folders and deletes older ones, except those whose
``up`` still runs (its pid is in the name). The parent folder is this user's own, readable by
nobody else (logs may name rollouts and hosts); if something else holds its name, the run
gets a fresh temporary folder and nothing is deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

KEEP = 5
_RUN = re.compile(r"^\d{8}-\d{6}-(?P<pid>\d+)$")


def runs_root() -> Path:
    return Path(tempfile.gettempdir()) / f"rollout-fleet-up-{os.getuid()}"


def _own_folder(path: Path) -> bool:
    """A real folder (not a link to one) of this user, closed to others."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone's process: not ours to judge, keep its folder
        return True
    return True


def prune(root: Path, keep: int = KEEP) -> list[Path]:
    """Delete the run folders in ``root`` beyond the newest ``keep``, except those of an ``up``
    that runs; the folders deleted."""
    folders = sorted(  # newest first: the name starts with when the run began
        (path for path in root.iterdir() if _RUN.match(path.name) and _own_folder(path)),
        key=lambda path: path.name,
        reverse=True,
    )
    deleted = []
    for old in folders[keep:]:
        match = _RUN.match(old.name)
        assert match is not None
        if not _running(int(match["pid"])):
            shutil.rmtree(old, ignore_errors=True)
            deleted.append(old)
    return deleted


def new_run_folder(pid: int, root: Path | None = None, keep: int = KEEP) -> Path:
    """A new folder for the run of ``up`` ``pid``, after deleting old ones (see the module)."""
    root = root or runs_root()
    with contextlib.suppress(OSError):  # a file holds the name: judged below
        root.mkdir(mode=0o700, exist_ok=True)
    if not _own_folder(root):
        return Path(tempfile.mkdtemp(prefix="rollout-fleet-up-"))
    folder = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{pid}"
    folder.mkdir(mode=0o700, exist_ok=True)
    prune(root, keep)
    return folder


__all__ = ["KEEP", "new_run_folder", "prune", "runs_root"]
