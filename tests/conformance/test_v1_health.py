"""CONFORMANCE §C item 23: fleet-wide active/completed counts, read from Redis."""

from __future__ import annotations

import time

from tests.conftest import module_fleet
from tests.harness import FleetUnderTest, script

counting = module_fleet(workers=2, concurrency=5)


def test_23_active_counts_running_rollouts_then_completed_counts_them(
    counting: FleetUnderTest,
) -> None:
    before = counting.http.get("/health").json()
    assert before["active_rollouts"] == 0
    bodies = [counting.body(metadata=script({"sleep": 2}, {"complete": {}})) for _ in range(4)]
    for body in bodies:
        assert counting.init(body).status_code == 202
    during = counting.http.get("/health").json()
    assert during["active_rollouts"] == 4

    counting.wait_delivered([b["rollout_id"] for b in bodies])
    deadline = time.monotonic() + 10
    after = counting.http.get("/health").json()
    while after["active_rollouts"] and time.monotonic() < deadline:
        time.sleep(0.05)
        after = counting.http.get("/health").json()
    assert after["active_rollouts"] == 0
    assert after["completed_rollouts"] - before["completed_rollouts"] == 4
