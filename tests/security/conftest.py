"""Fleets locked down the way a careful operator runs one: a server key, the trainer URLs
allowed (only the mock TrainGate's), a small request size limit. One per protocol."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import SCRIPTED_V2_AGENT, FleetUnderTest, MockTrainGateClient, V2FleetUnderTest

SERVER_KEY = "osm_rollout_Security-Key_0123456789"
MAX_REQUEST_BYTES = 256 * 1024


def locked_env(trainer: MockTrainGateClient) -> dict[str, str]:
    return {
        "ROLLOUT_FLEET_API_KEY": SERVER_KEY,
        "ROLLOUT_FLEET_ALLOWED_TRAINER_URLS": f"{trainer.url}/, http://trainer.example:9000/gate",
        "ROLLOUT_FLEET_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
    }


@pytest.fixture(scope="package")
def locked_v1(start_fleet: StartFleet, mock_trainer: MockTrainGateClient) -> Iterator[Any]:
    handle = start_fleet(workers=1, env=locked_env(mock_trainer))
    handle.http.headers["Authorization"] = f"Bearer {SERVER_KEY}"
    yield handle
    handle.close()


@pytest.fixture(scope="package")
def locked_v2(start_fleet: StartFleet, mock_trainer: MockTrainGateClient) -> Iterator[Any]:
    handle = start_fleet(
        SCRIPTED_V2_AGENT,
        workers=1,
        gateways=2,
        handle=V2FleetUnderTest,
        env={**V2_ENV, **locked_env(mock_trainer)},
    )
    yield handle
    handle.close()


@pytest.fixture(params=["v1", "v2"])
def locked(request: pytest.FixtureRequest) -> FleetUnderTest:
    handle: FleetUnderTest = request.getfixturevalue(f"locked_{request.param}")
    return handle


def admit(handle: FleetUnderTest, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    path = "/v1/rollout/init" if handle.protocol == "v1" else "/rollout"
    return handle.http.post(path, json=body, **kwargs)
