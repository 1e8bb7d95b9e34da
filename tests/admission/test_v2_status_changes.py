"""What a v2 rollout's status changes cost and tell (CONFORMANCE 82 and 84).

Every change is published with the new status, so a long-poll it ends answers without reading
the record; a grader done within ``GRADING_REPORT_DELAY_SECONDS`` is not reported as
``grading`` (that write, the poll it ends and the one after would cost more than the
grading), a slower one is, before the final status.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis

from rollout_worker.v2 import GRADING_REPORT_DELAY_SECONDS
from tests.conftest import v2_fleet
from tests.harness import Subscription, V2FleetUnderTest

fleet = v2_fleet(gateways=1, workers=1)
TERMINAL = {"success", "failure", "cancelled"}


class Changes(Subscription):
    """Every message on the fleet's change channel while inside."""

    def __init__(self, fleet: V2FleetUnderTest) -> None:
        super().__init__(fleet, fleet.keys.changes)

    def of(self, record: str) -> list[str]:
        """The statuses published for ``record``, in order."""
        return [m.split(" ", 1)[0] for m in self.messages if m.split(" ", 1)[1] == record]


def test_a_quick_grader_is_not_reported_grading_and_each_change_carries_its_status(
    fleet: V2FleetUnderTest,
) -> None:
    with Changes(fleet) as changes:
        final = fleet.run(metadata={"script": [{"chat": {}}], "grade": [{"reward": 1.0}]})
    assert final["status"] == "success"
    record = fleet.record_key(final["rollout_id"])
    assert changes.of(record) == ["running", "success"]


def test_a_slow_grader_is_reported_grading_before_its_final_status(
    fleet: V2FleetUnderTest,
) -> None:
    """CONFORMANCE 82 and 84: the poll waiting on the running rollout returns at
    ``grading``; the statuses successive polls see never go backwards."""
    grading_for = max(1.0, 20 * GRADING_REPORT_DELAY_SECONDS)
    metadata = {"script": [{"chat": {}}], "grade": [{"sleep": grading_for}, {"reward": 1.0}]}
    with Changes(fleet) as changes:
        rollout_id, token = fleet.admitted(metadata=metadata)
        seen: list[str] = []
        while not seen or seen[-1] not in TERMINAL:
            response = fleet.poll(rollout_id, token)
            assert response.status_code == 200, response.text
            seen.append(response.json()["status"])
    order = ["queued", "running", "grading", "success"]
    assert "grading" in seen, seen
    assert [order.index(status) for status in seen] == sorted(order.index(s) for s in seen)
    assert changes.of(fleet.record_key(rollout_id)) == ["running", "grading", "success"]


def test_a_poll_woken_by_a_change_answers_without_reading_the_record(
    fleet: V2FleetUnderTest,
) -> None:
    """The long-polls ended by ``running`` and ``grading`` read nothing: outside its poll
    scripts the gateway reads the record once (HMGET), for the final result. Before, every
    poll a change ended read it again."""
    metadata = {
        "script": [{"sleep": 1.0}, {"chat": {}}],
        "grade": [{"sleep": 1.0}, {"reward": 1.0}],
    }
    rollout_id, token = fleet.admitted(metadata=metadata)
    record = fleet.record_key(rollout_id)
    fleet.wait_status(rollout_id, {"running"})
    reads: list[str] = []
    stop = threading.Event()
    client = redis.Redis.from_url(fleet.fleet.redis_url, decode_responses=True)

    def watch() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            while not stop.is_set():
                command = monitor.next_command()
                words = command["command"].split()
                if command["client_type"] != "lua" and words[:2] == ["HMGET", record]:
                    reads.append(command["command"])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.3)
    statuses: list[str] = []
    while not statuses or statuses[-1] not in TERMINAL:
        statuses.append(fleet.poll(rollout_id, token).json()["status"])
    stop.set()
    client.ping()  # one more command, so the monitor's last read returns
    watcher.join(5)
    client.close()
    assert statuses[-2:] == ["grading", "success"], statuses  # a poll the change ended, then
    assert len(reads) == 1, reads  # the final one


def test_a_change_older_than_what_the_poll_saw_is_not_its_answer(
    fleet: V2FleetUnderTest,
) -> None:
    """CONFORMANCE 84: a listener lagging behind can hand a waiting poll a change older than
    the status its poll script read (``queued`` after it saw ``running``); the poll then
    reads the record instead of answering a status that went backwards."""
    rollout_id, token = fleet.admitted(metadata={"script": [{"sleep": 3.0}, {"chat": {}}]})
    record = fleet.record_key(rollout_id)
    fleet.wait_status(rollout_id, {"running"})
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(fleet.poll, rollout_id, token)
        time.sleep(0.5)  # the poll is waiting
        fleet.redis.publish(fleet.keys.changes, f"queued {record}")
        status = answer.result(timeout=30).json()["status"]
    assert status == "running"
