"""CONFORMANCE §B (authentication, P§1.2) and §C items 22/24 (health endpoints) with a
server key configured on the fleet."""

from __future__ import annotations

import pytest

from tests.conftest import module_fleet
from tests.harness import FleetUnderTest

SERVER_KEY = "osm_rollout_TestKey-With-Case_123"
INVALID = {"detail": "Invalid or missing API key"}


keyed = module_fleet(workers=1, env={"ROLLOUT_FLEET_API_KEY": SERVER_KEY})


def test_16_missing_authorization_is_401(keyed: FleetUnderTest) -> None:
    body = keyed.body()
    response = keyed.init(body)
    assert response.status_code == 401
    assert response.json() == INVALID
    assert keyed.redis.exists(keyed.record_key(body["rollout_id"])) == 0


@pytest.mark.parametrize(
    "header", [f"Bearer {SERVER_KEY}", f"bearer {SERVER_KEY}", f"BEARER {SERVER_KEY}", SERVER_KEY]
)
def test_17_bearer_any_case_or_raw_token_is_accepted(keyed: FleetUnderTest, header: str) -> None:
    body = keyed.body()
    assert keyed.init(body, headers={"Authorization": header}).status_code == 202
    keyed.wait_delivered([body["rollout_id"]])


@pytest.mark.parametrize(
    "header",
    [
        "Bearer wrong",
        f"Bearer {SERVER_KEY.upper()}",
        SERVER_KEY.lower(),
        f"Basic {SERVER_KEY}",
        "Bearer",
        "",
    ],
)
def test_18_wrong_or_differently_cased_key_is_401(keyed: FleetUnderTest, header: str) -> None:
    response = keyed.init(keyed.body(), headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json() == INVALID


def test_19_invalid_body_without_auth_is_422_not_401(keyed: FleetUnderTest) -> None:
    response = keyed.http.post("/v1/rollout/init", json={"rollout_id": "x"})
    assert response.status_code == 422


def test_22_health_needs_no_auth_and_has_the_v1_shape(keyed: FleetUnderTest) -> None:
    response = keyed.http.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "healthy"
    assert body["agent_loop"] == "scripted"
    assert isinstance(body["active_rollouts"], int)
    assert isinstance(body["completed_rollouts"], int)


@pytest.mark.parametrize("header", [None, "Bearer nope"])
def test_24_platform_health_rejects_a_missing_or_bad_key(
    keyed: FleetUnderTest, header: str | None
) -> None:
    headers = {"Authorization": header} if header else {}
    response = keyed.http.get("/platform/health", headers=headers)
    assert response.status_code == 401
    assert response.json() == INVALID


def test_24_platform_health_with_the_key_mirrors_health(keyed: FleetUnderTest) -> None:
    response = keyed.http.get("/platform/health", headers={"Authorization": f"Bearer {SERVER_KEY}"})
    assert response.status_code == 200
    assert response.json().keys() == {
        "status",
        "agent_loop",
        "active_rollouts",
        "completed_rollouts",
    }


def test_24_platform_health_without_a_configured_key_is_404(fleet: FleetUnderTest) -> None:
    response = fleet.http.get("/platform/health")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found"}


def test_20_without_a_configured_key_no_authorization_is_needed(fleet: FleetUnderTest) -> None:
    body = fleet.body()
    assert fleet.init(body).status_code == 202
    fleet.wait_delivered([body["rollout_id"]])
