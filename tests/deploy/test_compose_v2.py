"""Issue acceptance (deployment, v2): the compose stack serving the bundled Strands example,
named in ``.env`` the way a user names their agent, runs v2 rollouts end to end behind the
server key, and the trainers' keys it was handed stay out of logs, Redis and Flower."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from tests.deploy.conftest import Stack
from tests.harness import REPO, MockTrainGateClient, run_v2_dataset

EXAMPLE = REPO / "examples/strands_multiply"
ROLLOUTS = 50


@pytest.fixture(scope="module")
def stack_settings() -> dict[str, str]:
    return {"AGENT_DIR": "./examples/strands_multiply", "AGENT": "/agent/main.py"}


def test_v2_rollouts_run_through_the_declared_services(
    stack: Stack, mock_trainer: MockTrainGateClient
) -> None:
    with stack.gateway() as gateway:
        ready = gateway.get("/ready").json()
    assert (ready["protocol"], ready["agent"], ready["workers"]) == ("v2", "strands-multiply", 2)
    assert httpx.get(f"{stack.gateway_url}/ready").status_code == 401  # server key required

    results = asyncio.run(
        run_v2_dataset(
            stack.gateway_url,
            mock_trainer.url,
            EXAMPLE,
            ROLLOUTS,
            api_key=stack.planted["ROLLOUT_FLEET_API_KEY"],
        )
    )
    assert len(results) == ROLLOUTS
    for result, label in results.values():
        assert result["status"] == "success", result
        assert result["sample"]["reward"] == (0.0 if label == "-1" else 1.0)

    store = stack.redis()
    owners = [store.hget(f"rf:v2:{rollout_id}", "worker") for rollout_id in results]
    hosts = Counter(owner.rsplit(":", 1)[0] for owner in owners if owner)
    assert len(hosts) == 2, f"both worker replicas should have run rollouts: {hosts}"

    trainer_keys = {f"LLM key of {rollout_id}": f"key-{rollout_id}" for rollout_id in results}
    assert stack.leaks({**trainer_keys, "server key": stack.planted["ROLLOUT_FLEET_API_KEY"]}) == []
