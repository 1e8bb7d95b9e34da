"""A worker told to stop while Redis does not answer exits within its
grace (plus the bounded hand-back and close), and the rollout it held is not lost."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from rollout_worker.runtime import CLOSE_SECONDS, HAND_BACK_SECONDS
from tests.conftest import TEST_ENV
from tests.harness import SCRIPTED_AGENT, FleetUnderTest, MockTrainGateClient, new_id, script

GRACE_SECONDS = 2.0
# Interpreter start-up is not in it: only a loaded machine's slowness to run the exit.
MARGIN_SECONDS = 5.0


@pytest.fixture
def stoppable_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own: it gets SIGSTOPped (the fleet's session one must not)."""
    server = RedisServer().start()
    yield server
    assert server.process is not None
    server.process.signal(signal.SIGCONT)
    server.stop()


def test_a_worker_stopped_while_redis_is_frozen_exits_within_its_grace(
    stoppable_redis: RedisServer, mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=stoppable_redis.url,
        workers=1,
        concurrency=4,
        env={**TEST_ENV, "ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS": str(GRACE_SECONDS)},
        log_dir=tmp_path,
    )
    handle = FleetUnderTest(fleet, mock_trainer)
    try:
        fleet.start()
        rollout_id = new_id("frozen")
        steps = script({"sleep": 4}, {"complete": {}})
        assert handle.init(handle.body(rollout_id, metadata=steps)).status_code == 202
        handle.wait_status(rollout_id, {"running"})

        assert stoppable_redis.process is not None
        stoppable_redis.process.signal(signal.SIGSTOP)  # accepts connections, answers nothing
        worker = fleet.processes["worker-1"]
        stopping_at = time.monotonic()
        worker.terminate()
        bound = GRACE_SECONDS + HAND_BACK_SECONDS + CLOSE_SECONDS + MARGIN_SECONDS
        while worker.alive() and time.monotonic() - stopping_at < bound:
            time.sleep(0.1)
        stopped_in = time.monotonic() - stopping_at
        assert not worker.alive(), f"the worker still runs {stopped_in:.0f}s after SIGTERM"
        assert worker.stop() == 0  # reaped: the stop asked for happened

        # Redis is back: the rollout's lease lapsed, a new worker's sweeper requeues it.
        stoppable_redis.process.signal(signal.SIGCONT)
        assert fleet.restart_dead_workers() == ["worker-1"]
        handle.wait_delivered([rollout_id], timeout=60)
    finally:
        handle.close()
