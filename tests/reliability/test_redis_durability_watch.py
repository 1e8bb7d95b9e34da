"""The Redis data-loss check (``rollout_core/durability.py``) on a running fleet: it ran only
at start, so a Redis restarted without persistence under a running fleet went unnoticed
(``/ready`` 200, nothing logged) until the next restart lost every admitted rollout. Real
redis-server, gateway and worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_fleet.local import LocalFleet
from rollout_fleet.processes import wait_until
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV
from tests.harness import SCRIPTED_AGENT, FleetUnderTest, MockTrainGateClient


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RedisServer]]:
    started: list[RedisServer] = []
    yield started
    for server in started:
        server.stop()


def test_a_redis_restarted_without_persistence_unreadies_a_running_fleet(
    servers: list[RedisServer], mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    durable = RedisServer(appendonly=True, data_dir=tmp_path / "redis").start()
    servers.append(durable)
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=durable.url,
        workers=1,
        env=dict(TEST_ENV),
        log_dir=tmp_path / "fleet",
    )
    handle = FleetUnderTest(fleet, mock_trainer)
    fleet.start()
    try:
        assert handle.http.get("/ready").status_code == 200
        durable.stop()
        forgetful = RedisServer(port=durable.port, appendonly=False, data_dir=tmp_path / "r2")
        servers.append(forgetful.start())

        def unready() -> bool:
            return handle.http.get("/ready").status_code == 503

        wait_until(unready, 30, "/ready to fail")
        ready = handle.http.get("/ready").json()
        assert ready["redis"] == "ok"
        assert "persistence is off" in ready["durability"]
        assert "ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS" in ready["durability"]
        worker = fleet.processes["worker-1"]
        wait_until(lambda: "persistence is off" in worker.output(), 30, "the worker to say so")
    finally:
        handle.close()
