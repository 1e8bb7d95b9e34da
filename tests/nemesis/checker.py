"""The invariants, checked against every rollout's history once the schedule ran: its record
in Redis, the callbacks the mock TrainGate received (v1) and the trainer's final poll (v2)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.harness import TERMINAL, Protocol, Trainer
from tests.nemesis.faults import CRASHES, Nemesis
from tests.nemesis.stage import PREFIX, QUEUE, Stage

# A v1 callback may repeat only if a worker crashed between the POST and the write that
# records it: the repeat must follow a crash that came at most this long before the first
# callback arrived, or at most this long after it (a stopped worker's lease takes its lease,
# the sweep and the takeover to lapse).
CRASH_WINDOW_BEFORE = 1.0
CRASH_WINDOW_AFTER = 10.0
SETTLE_SECONDS = 180.0


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, message: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(message)


def check(stage: Stage, nemesis: Nemesis, trainers: dict[Protocol, Trainer]) -> Report:
    report = Report()
    client = stage.redis()
    records = {
        protocol: {i: stage.record_key(protocol, i) for i in trainer.admitted}
        for protocol, trainer in trainers.items()
    }
    statuses = _settle(client, records)
    callbacks = _v1_callbacks(stage, set(records["v1"]))
    for protocol, keys in records.items():
        for rollout_id, key in keys.items():
            record = client.hgetall(key)
            _check_record(report, nemesis, trainers[protocol], protocol, rollout_id, record)
            if protocol == "v1":
                _check_callbacks(report, nemesis, rollout_id, record, callbacks.get(rollout_id, []))
            if client.pttl(key) <= 0:
                report.fail(f"{key}: no TTL ({client.pttl(key)})")
    for protocol in ("v1", "v2"):
        for index in ("leases", "active"):
            if left := client.zcard(f"{PREFIX[protocol]}:{index}"):
                report.fail(f"{protocol}: {left} entries left in {index}")
        if left := client.llen(QUEUE[protocol]):
            report.fail(f"{protocol}: {left} messages left in its queue")
        for name, process in stage.fleets[protocol].processes.items():
            if not process.alive():
                report.fail(f"{protocol} {name} died by itself")
    repeats = sum(max(0, len(c) - 1) for c in callbacks.values())
    report.figures = {
        "statuses": {p: dict(Counter(statuses[p].values())) for p in statuses},
        "admitted": {p: len(t.admitted) for p, t in trainers.items()},
        "orphaned_v2": len(trainers["v2"].orphaned),
        "v1_callbacks": sum(len(c) for c in callbacks.values()),
        "v1_repeats": repeats,
        "crashes": dict(Counter(kind for _, kind in nemesis.crashes)),
        "faults": nemesis.log,
        "fault_errors": nemesis.errors,
    }
    client.close()
    return report


def _settle(client: Any, records: dict[Protocol, dict[str, str]]) -> dict[Protocol, dict[str, str]]:
    """Wait until every admitted rollout is terminal (or the settle time ran out)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        statuses = {
            protocol: {i: client.hget(k, "status") or "missing" for i, k in keys.items()}
            for protocol, keys in records.items()
        }
        done = all(s in TERMINAL for by in statuses.values() for s in by.values())
        if done or time.monotonic() > deadline:
            return statuses
        time.sleep(0.5)


def _v1_callbacks(stage: Stage, admitted: set[str]) -> dict[str, list[dict[str, Any]]]:
    deadline = time.monotonic() + 60
    while True:
        calls = [c for c in stage.trainer.calls("completed") if c["status"] == 200]
        seen = {c["rollout_id"] for c in calls}
        if admitted <= seen or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(CRASH_WINDOW_AFTER)  # a repeat would arrive now
    by_id: dict[str, list[dict[str, Any]]] = {}
    for call in stage.trainer.calls("completed"):
        if call["status"] == 200:
            by_id.setdefault(call["rollout_id"], []).append(call)
    return by_id


def _touched(nemesis: Nemesis, protocol: Protocol, rollout_id: str, accepted_ms: int) -> bool:
    """Whether a cancel, a revoke or a cancel-all may have reached the rollout."""
    if rollout_id in nemesis.cancelled:
        return True
    if protocol == "v2" and any(rollout_id.startswith(g) for g in nemesis.cancelled_groups):
        return True
    return protocol == "v2" and any(accepted_ms <= (t + 1) * 1000 for t in nemesis.cancel_all_at)


def _check_record(
    report: Report,
    nemesis: Nemesis,
    trainer: Trainer,
    protocol: Protocol,
    rollout_id: str,
    record: dict[str, str],
) -> None:
    status = record.get("status", "missing")
    if status not in TERMINAL:
        report.fail(f"{protocol} {rollout_id}: lost or stuck ({status})")
        return
    if record.get("terminations") != "1":
        report.fail(f"{protocol} {rollout_id}: terminated {record.get('terminations')} times")
    if record.get("cancel_requested") and status == "success":
        report.fail(f"{protocol} {rollout_id}: cancelled, yet success")
    touched = _touched(nemesis, protocol, rollout_id, int(record.get("accepted_at", 0)))
    if not touched and rollout_id not in trainer.orphaned and status != "success":
        report.fail(f"{protocol} {rollout_id}: untouched, yet {status}: {record.get('result')}")
    if protocol == "v2" and rollout_id in trainer.results:
        polled = trainer.results[rollout_id]["status"]
        if polled != status:
            report.fail(f"v2 {rollout_id}: polled {polled}, record says {status}")


def _check_callbacks(
    report: Report,
    nemesis: Nemesis,
    rollout_id: str,
    record: dict[str, str],
    calls: list[dict[str, Any]],
) -> None:
    if not calls:
        report.fail(f"v1 {rollout_id}: no callback ({record.get('status')})")
        return
    keys = {{k.lower(): v for k, v in c["headers"].items()}.get("idempotency-key") for c in calls}
    if keys != {rollout_id}:
        report.fail(f"v1 {rollout_id}: Idempotency-Key {keys}")
    bodies = {c["body"].get("status") for c in calls}
    if len(bodies) > 1:
        report.fail(f"v1 {rollout_id}: callbacks disagree: {bodies}")
    first = min(c["at"] for c in calls)
    crashes = [
        kind
        for at, kind in nemesis.crashes
        if kind in CRASHES and first - CRASH_WINDOW_BEFORE <= at <= first + CRASH_WINDOW_AFTER
    ]
    if len(calls) > 1 and not crashes:
        report.fail(f"v1 {rollout_id}: {len(calls)} callbacks, no crash near the first")


__all__ = ["CRASH_WINDOW_AFTER", "CRASH_WINDOW_BEFORE", "Report", "check"]
