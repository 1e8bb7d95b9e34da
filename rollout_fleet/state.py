"""Where the fleets ``rollout-fleet up`` runs are, for the CLI in another terminal.

Each ``up`` writes ``up-<pid>.json`` (its Redis URL, key prefix and gateway URL) to
``$XDG_RUNTIME_DIR/rollout-fleet/``, else ``$XDG_CACHE_HOME/rollout-fleet/`` (``~/.cache``),
readable by this user only: a Redis URL may hold a password. ``up`` removes it when it stops,
its reaper when it was killed. ``status``, ``ls``, ``cancel`` and ``export`` read it when
``REDIS_URL`` is not set.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class UpFleet:
    """One running ``rollout-fleet up``."""

    pid: int
    redis_url: str
    key_prefix: str
    gateway_url: str
    started_at: float  # time.time()


def state_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "rollout-fleet"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "rollout-fleet"


def state_file(pid: int) -> Path:
    return state_dir() / f"up-{pid}.json"


def announce(fleet: UpFleet) -> Path:
    """Write ``fleet``'s file, created readable by this user only, and return its path."""
    folder = state_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state_file(fleet.pid)
    partial = path.with_suffix(".tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(asdict(fleet), file)
    partial.replace(path)  # a reader never sees half a file
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running() -> list[UpFleet]:
    """The fleets of ``up`` processes still alive, newest first; stale files are removed."""
    fleets = []
    for path in state_dir().glob("up-*.json"):
        try:
            fleet = UpFleet(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being replaced, or not ours
        if _alive(fleet.pid):
            fleets.append(fleet)
        else:
            path.unlink(missing_ok=True)
    return sorted(fleets, key=lambda fleet: fleet.started_at, reverse=True)


__all__ = ["UpFleet", "announce", "running", "state_dir", "state_file"]
