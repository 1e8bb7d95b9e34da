"""``rollout-fleet up`` keeps the newest few runs' log folders, never one whose ``up`` still
runs, and deletes nothing it does not own (before, every run left a folder in /tmp)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_fleet import logdirs


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def running_pid() -> Iterator[int]:
    """The pid of a process that runs for the test (an ``up`` still serving)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process.pid
    process.kill()
    process.wait()


def make_runs(root: Path, pids: list[int]) -> list[Path]:
    """A run folder per pid, oldest first, each with a log in it."""
    root.mkdir(mode=0o700, exist_ok=True)
    folders = []
    for minute, pid in enumerate(pids):
        folder = root / f"20250101-10{minute:02d}00-{pid}"
        folder.mkdir(mode=0o700)
        (folder / "gateway.log").write_text("a log\n")
        folders.append(folder)
    return folders


def test_a_new_run_keeps_the_newest_five_and_those_of_a_running_up(
    tmp_path: Path, dead_pid: int, running_pid: int
) -> None:
    root = tmp_path / "runs"
    old = make_runs(root, [dead_pid, running_pid, *[dead_pid] * 6])
    (root / "notes").mkdir()  # not a run folder: never touched
    (root / "readme.txt").write_text("mine")

    new = logdirs.new_run_folder(os.getpid(), root=root)

    assert new.parent == root
    assert new.name.endswith(f"-{os.getpid()}")
    assert new.stat().st_mode & 0o777 == 0o700
    kept = sorted(path.name for path in root.iterdir())
    # the new one and the newest four old ones; the running up's, however old; the rest gone
    expected = sorted([new.name, *(f.name for f in old[-4:]), old[1].name, "notes", "readme.txt"])
    assert kept == expected
    assert (old[1] / "gateway.log").exists()


def test_nothing_is_deleted_through_a_folder_that_is_not_this_users_own(
    tmp_path: Path, dead_pid: int
) -> None:
    """Someone else's, or a link planted at the name: the run gets a fresh temporary folder
    and nothing where the name points is touched."""
    elsewhere = tmp_path / "elsewhere"
    old = make_runs(elsewhere, [dead_pid] * 7)
    root = tmp_path / "runs"
    root.symlink_to(elsewhere)

    new = logdirs.new_run_folder(os.getpid(), root=root)

    assert new.parent != root
    assert new.is_dir()
    assert all(folder.exists() for folder in old)
    new.rmdir()


def test_a_folder_others_may_read_is_not_used(tmp_path: Path, dead_pid: int) -> None:
    root = tmp_path / "runs"
    old = make_runs(root, [dead_pid] * 7)
    root.chmod(0o755)

    new = logdirs.new_run_folder(os.getpid(), root=root)

    assert new.parent != root
    assert all(folder.exists() for folder in old)
    new.rmdir()


def test_the_folders_live_in_this_users_place_in_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert logdirs.runs_root() == tmp_path / f"rollout-fleet-up-{os.getuid()}"
