"""Each v2 rollout's artifacts directory (S§2.14): where it is, that workflow and grader share
it, what happens when it cannot be made, and which roots are made on a thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from rollout_sdk import AgentWorkflow, AgentWorkflowContext, ExecutionRequest, Grader
from rollout_sdk.backend import artifacts
from rollout_sdk.backend.artifacts import ARTIFACT_ROOT_ENV, artifacts_dir, filesystem_of
from rollout_sdk.backend.execution import WorkflowBundle, execute_rollout
from rollout_sdk.context import GraderContext, RolloutContext

pytestmark = pytest.mark.anyio

MOUNTS = "\n".join(
    [
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw",
        "40 22 0:45 / /srv/shared rw - nfs4 storage:/export rw,vers=4.2",
        r"41 40 0:46 / /srv/shared/my\040scratch rw - tmpfs tmpfs rw",
        "42 22 0:47 / /srv/sharedness rw - fuse.s3fs s3fs rw",
    ]
)


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/home/trainer/.osmosis", "ext4"),
        ("/srv/shared", "nfs4"),
        ("/srv/shared/run-7/artifacts", "nfs4"),
        ("/srv/shared/my scratch/run-7", "tmpfs"),  # the deepest mount wins; \040 is a space
        ("/srv/sharedness/run-7", "fuse.s3fs"),  # a name prefix is not a parent directory
    ],
)
def test_a_root_s_filesystem_is_the_deepest_mount_above_it(path: str, fstype: str) -> None:
    assert filesystem_of(Path(path), MOUNTS) == fstype


def test_no_mount_table_means_no_filesystem() -> None:
    assert filesystem_of(Path("/anywhere"), "") is None


async def test_workflow_and_grader_share_the_rollout_s_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ARTIFACT_ROOT_ENV, str(tmp_path))
    seen: list[Path | None] = []
    read: list[str] = []

    class Writes(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
            seen.append(ctx.artifacts_dir)
            assert ctx.artifacts_dir is not None
            (ctx.artifacts_dir / "notes.txt").write_text("from the workflow")

    class Reads(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            seen.append(ctx.artifacts_dir)
            assert ctx.artifacts_dir is not None
            read.append((ctx.artifacts_dir / "notes.txt").read_text())

    await execute_rollout(
        WorkflowBundle(Writes, grader_cls=Reads),
        ExecutionRequest(id="r-1", prompt=[], label="x"),
        RolloutContext(rollout_id="r-1"),
    )
    assert seen == [tmp_path / "r-1" / "artifacts"] * 2
    assert read == ["from the workflow"]
    # The same rollout run again (a retry on this worker) finds its directory there.
    assert await artifacts_dir("r-1") == tmp_path / "r-1" / "artifacts"


async def test_a_missing_root_is_made_and_an_unusable_one_gives_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ARTIFACT_ROOT_ENV, str(tmp_path / "new" / "root"))
    made = await artifacts_dir("r-2")
    assert made == tmp_path / "new" / "root" / "r-2" / "artifacts"
    assert made.is_dir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ARTIFACT_ROOT_ENV, str(blocker))
    assert await artifacts_dir("r-3") is None


async def test_a_root_on_a_network_filesystem_is_made_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local root is made on the event loop's thread (no hand-over); an NFS root, or one
    whose filesystem cannot be told, on another (a mkdir there can wait on a server)."""
    threads: list[int] = []
    make = artifacts._make

    def recording(path: Path) -> None:
        threads.append(threading.get_ident())
        make(path)

    monkeypatch.setattr(artifacts, "_make", recording)
    for table, on_the_loop in (
        ("1 0 8:1 / / rw - ext4 /dev/sda1 rw", True),
        ("1 0 0:9 / / rw - nfs4 srv:/x rw", False),
        ("", False),
    ):
        artifacts.on_local_filesystem.cache_clear()
        monkeypatch.setattr(artifacts, "_read_mounts", lambda table=table: table)
        root = tmp_path / f"root-{len(threads)}"
        monkeypatch.setenv(ARTIFACT_ROOT_ENV, str(root))
        assert await artifacts_dir("r") == root / "r" / "artifacts"
        assert (threads[-1] == threading.get_ident()) is on_the_loop
    artifacts.on_local_filesystem.cache_clear()
