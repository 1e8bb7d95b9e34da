"""A result has a budget before it is written (``ROLLOUT_FLEET_RESULT_MAX_MB``): a larger one
ends the rollout once, as a failure that names the budget, and nothing larger than the budget
reaches Redis or the trainer. Real gateway, workers, redis-server and mock TrainGate; the
large result is the agent's own (it echoes a 1.5 MB prompt), so only the budget is tested."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import (
    SCRIPTED_V2_AGENT,
    FleetUnderTest,
    V2FleetUnderTest,
    new_id,
    script,
)

BUDGET = {"ROLLOUT_FLEET_RESULT_MAX_MB": "1"}
LARGE = "x" * 1_500_000
MIB = 1024 * 1024


def largest_value(handle: FleetUnderTest) -> int:
    """The largest string Redis holds for this fleet (a hash's field or a plain value)."""
    largest = 0
    for key in handle.redis.scan_iter(f"{handle.prefix}*"):
        kind = handle.redis.type(key)
        if kind == "hash":
            for name in handle.redis.hkeys(key):
                largest = max(largest, handle.redis.hstrlen(key, name))
        elif kind == "string":
            largest = max(largest, handle.redis.strlen(key))
    return largest


@pytest.fixture(scope="module")
def v1(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    handle = start_fleet(workers=1, env=BUDGET)
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def v2(start_fleet: StartFleet) -> Iterator[V2FleetUnderTest]:
    handle = start_fleet(
        SCRIPTED_V2_AGENT, workers=1, env={**V2_ENV, **BUDGET}, handle=V2FleetUnderTest
    )
    assert isinstance(handle, V2FleetUnderTest)
    yield handle
    handle.close()


def test_a_v1_result_over_the_budget_ends_once_as_a_failure_naming_it(v1: FleetUnderTest) -> None:
    rollout_id, small = new_id("over-budget"), new_id("in-budget")
    big = v1.body(
        rollout_id,
        messages=[{"role": "user", "content": LARGE}],
        metadata=script({"echo_request": True}, {"complete": {}}),
    )
    assert v1.init(big).status_code == 202
    assert v1.init(v1.body(small, metadata=script({"complete": {}}))).status_code == 202
    record = v1.wait_status(rollout_id, {"success", "failure"}, timeout=30)
    v1.wait_status(small, {"success"}, timeout=30)
    assert record["status"] == "failure"
    assert record["attempt"] == "1"
    assert record["terminations"] == "1"
    deliveries = v1.trainer.deliveries()[rollout_id]
    assert len(deliveries) == 1
    assert deliveries[0]["status"] == "ERROR"
    assert (
        "over the 1 MiB a result may take (ROLLOUT_FLEET_RESULT_MAX_MB)"
        in (deliveries[0]["error_message"])
    )
    view = v1.http.get(f"/v1/rollouts/{rollout_id}").json()
    assert "ROLLOUT_FLEET_RESULT_MAX_MB" in str(view)
    # The request itself holds the 1.5 MB prompt; no result, turns or trajectory does.
    assert v1.redis.hstrlen(v1.record_key(rollout_id), "result") < 10_000
    assert largest_value(v1) < 2 * MIB


def test_a_v2_result_over_the_budget_ends_once_as_a_validation_error(
    v2: V2FleetUnderTest,
) -> None:
    result = v2.run(
        initial_messages=[{"role": "user", "content": LARGE}],
        metadata={"script": [{"echo": True}], "grade": [{"reward": 1.0}]},
    )
    assert result["status"] == "failure"
    assert result["err_category"] == "validation_error"
    assert "(ROLLOUT_FLEET_RESULT_MAX_MB)" in result["err_message"]
    assert largest_value(v2) < 2 * MIB
    small = v2.run(metadata={"script": [], "grade": [{"reward": 1.0}]})
    assert small["status"] == "success"
