"""Worker liveness and capacity use Redis's clock, not each host's. Workers run
under ``faketime`` 90 s behind or ahead of the gateway's host; before, the one behind never
counted as live (``/ready`` saw no worker). The one ahead dropped out in time already (its
heartbeat key's Redis TTL bounded it); that test keeps it so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rollout_fleet.local import fleet_command
from rollout_fleet.processes import ManagedProcess
from tests.conftest import StartFleet
from tests.harness import FleetUnderTest, new_id

# The library itself, preloaded into the worker (the faketime wrapper would stand between
# the test and the worker's pid).
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
pytestmark = pytest.mark.skipif(not LIBFAKETIME.exists(), reason="needs faketime")
SKEW = 90


def skewed_worker(handle: FleetUnderTest, offset: str, log_dir: Path) -> ManagedProcess:
    argv = fleet_command("worker", "--name", f"skew{offset}@%h")
    env = {
        **handle.fleet.process_env(),
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    return ManagedProcess(f"worker{offset}", argv, env, log_dir / "worker.log").start()


def live_workers(handle: FleetUnderTest) -> int:
    return handle.fleet.readiness().workers


def wait_for(condition: object, timeout: float, what: str, handle: FleetUnderTest) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout}s\n{handle.logs()}")


def test_a_worker_behind_counts_as_live_and_runs_rollouts(
    start_fleet: StartFleet, tmp_path: Path
) -> None:
    handle = start_fleet(workers=0)
    worker = skewed_worker(handle, f"-{SKEW}s", tmp_path)
    try:
        wait_for(lambda: live_workers(handle) == 1, 60, "the worker 90 s behind is live", handle)
        rollout_id = new_id("behind")
        assert handle.init(handle.body(rollout_id)).status_code == 202
        (callback,) = handle.wait_delivered([rollout_id])[rollout_id]
        assert callback["status"] == "COMPLETED"
    finally:
        worker.stop()


def test_a_dead_worker_ahead_does_not_linger(start_fleet: StartFleet, tmp_path: Path) -> None:
    handle = start_fleet(workers=0)
    worker = skewed_worker(handle, f"+{SKEW}s", tmp_path)
    try:
        wait_for(lambda: live_workers(handle) == 1, 60, "the worker 90 s ahead is live", handle)
        worker.kill()
        # Its heartbeat lasts max(3, lease) = 3 s here; with its own clock it lasted 93 s.
        wait_for(lambda: live_workers(handle) == 0, 30, "the killed worker drops out", handle)
    finally:
        worker.stop()
