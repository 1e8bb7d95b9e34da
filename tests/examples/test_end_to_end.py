"""200 calculator rollouts through 2 worker processes — all COMPLETED with
correct rewards, exactly one completion callback per rollout id, records expiring on schedule."""

from __future__ import annotations

import time
from collections import Counter

from tests.conftest import module_fleet
from tests.harness import CALCULATOR_AGENT, FleetUnderTest, admit_all, calculator_bodies

RETENTION_SECONDS = 8


calculator = module_fleet(
    CALCULATOR_AGENT,
    workers=2,
    concurrency=50,
    env={"ROLLOUT_FLEET_RECORD_TTL_SECONDS": str(RETENTION_SECONDS)},
)


def test_200_rollouts_complete_once_with_correct_rewards(calculator: FleetUnderTest) -> None:
    bodies = calculator_bodies(calculator.trainer.url, 200)
    ids = [b["rollout_id"] for b in bodies]
    admit_all(calculator.http, bodies)
    deliveries = calculator.wait_delivered(ids, timeout=120)

    for body in bodies:
        (done,) = deliveries[body["rollout_id"]]  # exactly one callback each
        truth = body["metadata"]["ground_truth"]
        assert done["status"] == "COMPLETED"
        assert done["reward"] == (0.0 if truth == "-1" else 1.0)
        assert done["final_messages"][-1]["content"].startswith("#### ")
        assert done["metrics"]["num_llm_calls"] >= 2
        assert done["metrics"]["num_tool_calls"] == done["metrics"]["num_llm_calls"] - 1
    completed_posts = Counter(c["rollout_id"] for c in calculator.trainer.calls("completed"))
    assert all(completed_posts[i] == 1 for i in ids)

    records = [calculator.wait_status(i, {"success"}) for i in ids]
    assert all(r["attempt"] == "1" for r in records)
    workers = Counter(r["worker"].rsplit(":", 1)[0] for r in records)
    assert len(workers) == 2, f"both worker processes should have run rollouts: {workers}"
    health = calculator.http.get("/health").json()
    assert health["active_rollouts"] == 0
    assert health["completed_rollouts"] == 200


def test_records_expire_on_schedule(calculator: FleetUnderTest) -> None:
    bodies = calculator_bodies(calculator.trainer.url, 20)
    admit_all(calculator.http, bodies)
    calculator.wait_delivered([b["rollout_id"] for b in bodies])
    keys = [calculator.record_key(b["rollout_id"]) for b in bodies]
    for body in bodies:
        calculator.wait_status(body["rollout_id"], {"success"})
    ttls = [calculator.redis.pttl(key) for key in keys]
    assert all(0 < ttl <= RETENTION_SECONDS * 1000 for ttl in ttls), ttls
    assert not any(calculator.redis.hget(key, "secret") for key in keys)  # emptied

    deadline = time.monotonic() + RETENTION_SECONDS + 5
    while calculator.redis.exists(*keys) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert calculator.redis.exists(*keys) == 0
    assert list(calculator.redis.scan_iter(f"{calculator.keys.records_of('v1')}*")) == []
    assert calculator.http.get("/health").json()["completed_rollouts"] == 0
    assert calculator.redis.zcard(calculator.keys.active) == 0
    assert calculator.redis.zcard(calculator.keys.leases) == 0
