"""Each v2 rollout's artifacts directory, ``<root>/<rollout_id>/artifacts/`` (SDK.md §2.14).

Every rollout gets one, so making it is on every rollout's path. On a local filesystem a
``mkdir`` is a few tens of microseconds of kernel work that never waits on a network: it is
made on the event loop. Handing it to a thread instead costs twice the ``mkdir`` itself
(the hand-over, then the GIL passed back and forth at each system call: 145 µs through a
thread against 46 µs inline, CHANGELOG.md). A root on a network filesystem (NFS, SMB,
FUSE, ...: a root shared by a fleet) can make a ``mkdir`` wait on a server, so there it goes
to a thread; so does any filesystem this module cannot name.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
MOUNTS = Path("/proc/self/mountinfo")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
# Filesystems whose metadata operations are served by this host's kernel alone.
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "ramfs", "overlay"}
)


def artifact_root() -> Path:
    """Where artifacts go: ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``, else ``~/.osmosis``."""
    return Path(os.environ.get(ARTIFACT_ROOT_ENV) or Path.home() / ".osmosis")


async def artifacts_dir(rollout_id: str) -> Path | None:
    """The rollout's artifacts directory, made; ``None`` when it cannot be made."""
    root = artifact_root()
    path = root / rollout_id / "artifacts"
    try:
        if on_local_filesystem(str(root)):
            _make(path)
        else:
            await asyncio.to_thread(_make, path)
    except OSError:
        logger.warning("cannot create the artifacts directory %s", path)
        return None
    return path


def _make(path: Path) -> None:
    """Two ``mkdir`` calls when the root exists and the rollout's directory does not (the
    usual case); the general one otherwise (a missing root, a rollout run again here)."""
    try:
        os.mkdir(path.parent)
        os.mkdir(path)
    except OSError:
        path.mkdir(parents=True, exist_ok=True)


@functools.lru_cache(maxsize=8)
def on_local_filesystem(root: str) -> bool:
    """Whether ``root`` lies on one of :data:`LOCAL_FILESYSTEMS` (decided once per root, from
    the mount table; ``False`` where there is none to read)."""
    fstype = filesystem_of(Path(root).resolve(), _read_mounts())
    return fstype in LOCAL_FILESYSTEMS


def filesystem_of(path: Path, mounts: str) -> str | None:
    """The type of the filesystem ``path`` is on, by the longest mount point above it in
    ``mounts`` (the format of ``/proc/self/mountinfo``)."""
    best: tuple[int, str] | None = None
    for line in mounts.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, described = fields.split(), tail.split()
        if len(parts) < 5 or not described:
            continue
        # Octal escapes stand for spaces, tabs, newlines and backslashes in mount points.
        mount = Path(_OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), parts[4]))
        above = path == mount or mount in path.parents
        if above and (best is None or len(mount.parts) > best[0]):
            best = (len(mount.parts), described[0])
    return None if best is None else best[1]


def _read_mounts() -> str:
    try:
        return MOUNTS.read_text()
    except OSError:
        return ""


__all__ = [
    "ARTIFACT_ROOT_ENV",
    "LOCAL_FILESYSTEMS",
    "artifact_root",
    "artifacts_dir",
    "filesystem_of",
    "on_local_filesystem",
]
