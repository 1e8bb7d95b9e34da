"""Fleet workers send upstream's rollout ownership logs: with ``OSMOSIS_ROLLOUT_OTLP_ENDPOINT``
set, a v2 rollout's worker reports ``running``, ``grading`` and its final status, in order,
as OTLP log records (received by a real receiver in this test), naming itself as the owner
and never the trainer's key."""

from __future__ import annotations

import socket

from rollout_sdk.testing.otlp import OtlpLogReceiver
from rollout_worker.v2 import GRADING_REPORT_DELAY_SECONDS
from tests.conftest import V2_ENV, StartFleet
from tests.harness import SCRIPTED_V2_AGENT, V2FleetUnderTest

LLM_KEY = "sk-trainer-key-that-must-not-travel"


def test_a_worker_reports_each_status_of_the_rollout_it_owns(start_fleet: StartFleet) -> None:
    with OtlpLogReceiver() as otlp:
        fleet = start_fleet(
            SCRIPTED_V2_AGENT,
            handle=V2FleetUnderTest,
            gateways=1,
            workers=1,
            env={
                **V2_ENV,
                "OSMOSIS_ROLLOUT_OTLP_ENDPOINT": otlp.url,
                "OSMOSIS_ROLLOUT_NAMESPACE": "team-a",
            },
        )
        assert isinstance(fleet, V2FleetUnderTest)
        grading_for = max(1.0, 20 * GRADING_REPORT_DELAY_SECONDS)
        metadata = {
            "script": [{"chat": {}}],
            "grade": [{"sleep": grading_for}, {"reward": 1.0}],
            "osmosis_observability": {"run_id": "run-9", "api_key": LLM_KEY},
        }
        result = fleet.run(metadata=metadata, llm_api_key=LLM_KEY)
        assert result["status"] == "success", result
        rollout_id = result["rollout_id"]
        otlp.wait_for(lambda r: any(log.attributes["status"] == "success" for log in r.logs))
        fleet.close()
    logs = sorted(
        otlp.where(rollout_id=rollout_id), key=lambda log: log.attributes["event_sequence"]
    )
    assert [log.attributes["status"] for log in logs] == ["running", "grading", "success"]
    owners = {log.attributes["server_id"] for log in logs}
    assert len(owners) == 1
    assert owners.pop().startswith(f"{socket.gethostname()}:")  # the worker's name
    for log in logs:
        assert log.service == "osmosis-rollout-server"
        assert log.attributes["event"] == "rollout.ownership"
        assert log.attributes["namespace"] == "team-a"
        assert log.attributes["run_id"] == "run-9"
    assert LLM_KEY.encode() not in b"".join(otlp.bodies)
