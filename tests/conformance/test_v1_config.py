"""CONFORMANCE §R items 138-141 (settings via environment) and §A item 13 (record TTL)."""

from __future__ import annotations

import time

import pytest

from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV, module_fleet
from tests.harness import SCRIPTED_AGENT, FleetUnderTest, script

tuned = module_fleet(
    workers=1,
    env={
        "OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": "0",
        "OSMOSIS_ROLLOUT_MAX_METADATA_SIZE_BYTES": "2048",
        "ROLLOUT_FLEET_RECORD_TTL_SECONDS": "2",
    },
)


def test_138_max_retries_0_means_a_500_is_tried_once(tuned: FleetUnderTest) -> None:
    body = tuned.body(metadata=script({"chat": {}}, {"complete": {}}))
    tuned.trainer.add_faults(
        {"target": "chat", "status": 500, "times": None, "rollout_id": body["rollout_id"]}
    )
    assert tuned.init(body).status_code == 202
    done = tuned.wait_delivered([body["rollout_id"]])[body["rollout_id"]][0]
    assert done["status"] == "ERROR"
    assert len(tuned.trainer.calls("chat", body["rollout_id"])) == 1


def test_141_metadata_limit_from_the_environment(tuned: FleetUnderTest) -> None:
    response = tuned.init(tuned.body(metadata={"pad": "x" * 3000}))
    assert response.status_code == 422
    assert "metadata size exceeds maximum allowed size" in response.text
    small = tuned.body(metadata={"pad": "x" * 1000})
    assert tuned.init(small).status_code == 202
    tuned.wait_delivered([small["rollout_id"]])


def test_13_after_the_record_ttl_the_same_id_runs_again(tuned: FleetUnderTest) -> None:
    body = tuned.body(metadata=script({"complete": {}}))
    assert tuned.init(body).status_code == 202
    tuned.wait_status(body["rollout_id"], {"success"})
    ttl_ms = tuned.redis.pttl(tuned.record_key(body["rollout_id"]))
    assert 1000 < ttl_ms <= 2000  # retention starts at completion
    assert tuned.init(body).status_code == 202  # within the TTL: replayed
    assert len(tuned.trainer.deliveries()[body["rollout_id"]]) == 1

    deadline = time.monotonic() + 5
    while tuned.redis.exists(tuned.record_key(body["rollout_id"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tuned.redis.exists(tuned.record_key(body["rollout_id"])) == 0
    assert tuned.init(body).status_code == 202  # forgotten: a brand-new rollout
    tuned.wait_status(body["rollout_id"], {"success"})
    assert len(tuned.trainer.deliveries()[body["rollout_id"]]) == 2


@pytest.mark.parametrize("process", ["gateway", "worker"])
def test_140_an_out_of_range_setting_fails_startup(
    process: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fleet = LocalFleet(
        SCRIPTED_AGENT,
        redis_server.url_for(0),
        env={**TEST_ENV, "OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": "11"},
        log_dir=tmp_path_factory.mktemp("bad-config"),
    )
    child = fleet.start_gateway() if process == "gateway" else fleet.start_worker(1)
    try:
        assert child.process is not None
        assert child.process.wait(timeout=60) != 0
    finally:
        child.stop()
    assert child.output() == (  # one line naming the variable, never a traceback
        "invalid setting OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES: Input should be less than or equal "
        "to 10\n"
    )
