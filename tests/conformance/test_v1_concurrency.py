"""CONFORMANCE §F — concurrency per worker process (P§1.8), and item 139.

The fleet enforces ``max_concurrent`` per worker process (Celery's pool size); these fleets
run one worker process, so the process limit is the fleet limit.
"""

from __future__ import annotations

import itertools

from tests.conftest import module_fleet
from tests.harness import FleetUnderTest, script

SLOW = script({"chat": {}}, {"sleep": 0.3}, {"chat": {}}, {"complete": {}})


def run_windows(fleet: FleetUnderTest, ids: list[str]) -> list[tuple[float, float]]:
    """Each rollout's run window: from its first LLM call to its last (as the mock saw them)."""
    windows = []
    for rollout_id in ids:
        calls = fleet.trainer.calls("chat", rollout_id)
        windows.append((calls[0]["at"], calls[-1]["at"]))
    return windows


def peak_overlap(windows: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows])
    peak = running = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


# Item 139: the serial fleet takes its limit from the environment, not from code or flags.
serial = module_fleet(
    workers=1, concurrency=None, env={"OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS": "1"}
)
pair = module_fleet(workers=1, concurrency=2)


def test_45_and_139_max_concurrent_1_runs_rollouts_strictly_one_after_another(
    serial: FleetUnderTest,
) -> None:
    bodies = [serial.body(metadata=SLOW) for _ in range(3)]
    assert [serial.init(b).status_code for b in bodies] == [202, 202, 202]
    ids = [b["rollout_id"] for b in bodies]
    serial.wait_delivered(ids)
    windows = sorted(run_windows(serial, ids))
    for (_, first_end), (second_start, _) in itertools.pairwise(windows):
        assert second_start >= first_end
    assert peak_overlap(windows) == 1


def test_46_max_concurrent_2_never_runs_more_than_two(pair: FleetUnderTest) -> None:
    bodies = [pair.body(metadata=SLOW) for _ in range(4)]
    assert {pair.init(b).status_code for b in bodies} == {202}
    ids = [b["rollout_id"] for b in bodies]
    deliveries = pair.wait_delivered(ids)
    assert all(deliveries[i][0]["status"] == "COMPLETED" for i in ids)
    assert peak_overlap(run_windows(pair, ids)) == 2


def test_47_never_429_however_loaded(serial: FleetUnderTest) -> None:
    bodies = [serial.body(metadata=script({"complete": {}})) for _ in range(150)]
    statuses = {serial.init(body).status_code for body in bodies}
    assert statuses == {202}
    serial.wait_delivered([b["rollout_id"] for b in bodies])


def test_48_total_latency_includes_the_wait_for_a_slot(serial: FleetUnderTest) -> None:
    first = serial.body(metadata=script({"sleep": 1.0}, {"complete": {}}))
    second = serial.body(metadata=script({"complete": {}}))
    assert serial.init(first).status_code == serial.init(second).status_code == 202
    deliveries = serial.wait_delivered([first["rollout_id"], second["rollout_id"]])
    waited = deliveries[second["rollout_id"]][0]["metrics"]["total_latency_ms"]
    ran = deliveries[first["rollout_id"]][0]["metrics"]["total_latency_ms"]
    assert waited >= 1000 * 0.8  # it queued behind a 1 s rollout
    assert waited >= ran * 0.8
