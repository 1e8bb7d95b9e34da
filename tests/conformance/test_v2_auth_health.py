"""CONFORMANCE §I (v2 authentication, P§2.2) and §O (v2 health, P§2.12), on a fleet with a
server key and the protocol's default timings."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.conftest import v2_fleet
from tests.harness import V2FleetUnderTest

KEY = "fleet-server-key-AbC"
keyed = v2_fleet(
    env={
        "ROLLOUT_FLEET_API_KEY": KEY,
        "ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "30",  # the protocol's defaults
        "_OSMOSIS_ROLLOUT_INSTANCE_ID": "dep-1",
    }
)
UNAUTHORIZED = {"detail": "unauthorized"}
ROUTES = [
    ("POST", "/rollout"),
    ("GET", "/rollout/some-id/result"),
    ("POST", "/rollout/cancel"),
    ("GET", "/health"),
    ("GET", "/no/such/path"),
    ("GET", "/docs"),
    ("POST", "/drain"),
]


def bare(fleet: V2FleetUnderTest) -> httpx.Client:
    return httpx.Client(base_url=fleet.fleet.gateway_url, timeout=30)


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"bearer {KEY}", KEY, f"Bearer  {KEY}"])
def test_74_75_every_route_needs_exactly_bearer_key(
    keyed: V2FleetUnderTest, method: str, path: str, header: str | None
) -> None:
    with bare(keyed) as client:
        headers = {"Authorization": header} if header else {}
        response = client.request(method, path, headers=headers, json={})
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED


def test_76_auth_comes_before_body_validation(keyed: V2FleetUnderTest) -> None:
    with bare(keyed) as client:
        assert client.post("/rollout", json={"nonsense": True}).status_code == 401
    assert keyed.http.post("/rollout", json={"nonsense": True}).status_code == 422


def _authorizations(keyed: V2FleetUnderTest, rollout_id: str) -> list[str | None]:
    return [c["headers"].get("authorization") for c in keyed.trainer.calls("chat", rollout_id)]


def test_77_the_llm_gets_the_llm_key_never_the_server_key(keyed: V2FleetUnderTest) -> None:
    with_key = keyed.body(llm_api_key="llm-key-123")
    keyed.result(with_key["rollout_id"], keyed.admit(with_key).json()["polling_lease_token"])
    assert _authorizations(keyed, with_key["rollout_id"]) == ["Bearer llm-key-123"]

    without = keyed.body()
    keyed.result(without["rollout_id"], keyed.admit(without).json()["polling_lease_token"])
    assert _authorizations(keyed, without["rollout_id"]) == [None]


def test_63_defaults_are_30_and_120(keyed: V2FleetUnderTest) -> None:
    admission = keyed.admit(keyed.body()).json()
    assert admission["result_wait_timeout_sec"] == 30.0
    assert admission["polling_lease_timeout_sec"] == 120.0


def test_82_a_poll_returns_early_on_a_status_change(keyed: V2FleetUnderTest) -> None:
    rollout_id, token = keyed.admitted(metadata={"script": [{"sleep": 1}, {"chat": {}}]})
    keyed.wait_status(rollout_id, {"running"})
    started = time.monotonic()
    body = keyed.poll(rollout_id, token).json()
    assert body["status"] in {"grading", "success"}
    assert time.monotonic() - started < 15  # well inside the 30 s wait


def health(fleet: V2FleetUnderTest, client: httpx.Client | None = None) -> dict[str, Any]:
    response = (client or fleet.http).get("/health")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_119_health_shape(keyed: V2FleetUnderTest) -> None:
    body = health(keyed)
    assert body["status"] == "ok"
    assert isinstance(body["process_id"], str)
    assert body["process_id"]
    assert body["lifecycle"]["accepting_rollouts"] is True
    assert body["lifecycle"]["active_rollouts"] >= 0
    assert body["concurrency"]["max_concurrent"] == 40  # two workers × 20 slots


def test_120_instance_id_from_the_environment_and_one_process_id_for_all_replicas(
    keyed: V2FleetUnderTest,
) -> None:
    """[decision] process_id names the deployment (its Redis state), so every replica reports
    the same one and a gateway restart keeps it; it changes only when that state is lost."""
    first, second = health(keyed), health(keyed, keyed.poller)
    assert first["instance_id"] == second["instance_id"] == "dep-1"
    assert first["process_id"] == second["process_id"]

    gateway = keyed.fleet.processes["gateway"]
    gateway.stop()
    restarted = keyed.fleet.start_gateway(index=1)
    keyed.fleet.wait_ready(60)
    assert restarted.alive()
    assert health(keyed)["process_id"] == first["process_id"]
    assert health(keyed)["instance_id"] == "dep-1"


def test_121_active_rollouts_counts_unfinished_ones(keyed: V2FleetUnderTest) -> None:
    admitted = [keyed.admitted(metadata={"script": [{"sleep": 1.5}]}) for _ in range(3)]
    assert health(keyed)["lifecycle"]["active_rollouts"] == 3
    for rollout_id, token in admitted:
        keyed.result(rollout_id, token)
    assert health(keyed, keyed.poller)["lifecycle"]["active_rollouts"] == 0
