"""A trainer-chosen URL may aim the workers at a service the trainer cannot reach itself: what
that service answers must never come back. Real gateway, worker and Redis; the "internal
service" is a local HTTP server whose every answer carries a secret. The rollout's result
(``GET /v1/rollouts/{id}``, the v2 long-poll), every key of its Redis database and every
fleet process's log must not contain it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import (
    STRANDS_AGENT,
    FleetUnderTest,
    InternalService,
    V2FleetUnderTest,
    all_logs,
    new_id,
    redis_dump,
)

SECRET = "internal-secret-7f3a9c"


@pytest.fixture(params=[404, 500, 200], ids=["404", "500", "200 not a completion"])
def internal(request: pytest.FixtureRequest) -> Iterator[InternalService]:
    service = InternalService(request.param, SECRET)
    yield service
    service.close()


EXPECTED_V1_ERRORS = {
    404: "POST {url}/v1/chat/completions returned 404 Not Found",
    500: "POST {url}/v1/chat/completions returned 500 Internal Server Error",
    200: "TrainGate returned an unusable chat completion: choices: Field required",
}


@pytest.fixture(scope="module")
def v1_fleet(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    handle = start_fleet(workers=1)
    yield handle
    handle.close()


def test_a_v1_rollout_never_reads_back_an_internal_services_answer(
    v1_fleet: FleetUnderTest, internal: InternalService
) -> None:
    rollout_id = new_id("foreign")
    server_url = f"{internal.url}/internal/api"
    assert v1_fleet.init(v1_fleet.body(rollout_id, server_url=server_url)).status_code == 202
    v1_fleet.wait_status(rollout_id, {"success", "failure"}, timeout=60)
    view = httpx.get(f"{v1_fleet.fleet.gateway_url}/v1/rollouts/{rollout_id}", timeout=10)
    assert view.status_code == 200, view.text
    result = view.json()
    assert result["error"] == EXPECTED_V1_ERRORS[internal.status].format(url=server_url), result
    for seen in (view.text, redis_dump(v1_fleet.redis), all_logs(v1_fleet)):
        assert SECRET not in seen


@pytest.fixture(scope="module")
def strands_fleet(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    env = {**V2_ENV, "OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": "1"}
    handle = start_fleet(STRANDS_AGENT, workers=1, gateways=1, handle=V2FleetUnderTest, env=env)
    yield handle
    handle.close()


def test_a_v2_rollout_never_reads_back_an_internal_services_answer(
    strands_fleet: V2FleetUnderTest, internal: InternalService
) -> None:
    """The Strands example calls the TrainGate through the SDK's OpenAI client."""
    url = f"{internal.url}/internal/v1"
    result = strands_fleet.run(chat_completions_url=url)
    if internal.status != 200:  # a 200 streams no events: an empty answer
        reason = EXPECTED_V1_ERRORS[internal.status].split(" returned ")[1]
        assert result["err_message"] == f"POST {url}/chat/completions returned {reason}", result
    for seen in (json.dumps(result), redis_dump(strands_fleet.redis), all_logs(strands_fleet)):
        assert SECRET not in seen
