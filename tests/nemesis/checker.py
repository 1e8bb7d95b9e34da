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
# the sweep and the takeover to lapse). A failover is a crash: the workers' Redis died, and
# a write it had not yet passed to the replica (the one recording a callback's outcome) is
# gone; with ``--replica-lag`` up to that long before the kill, so it must stay under 1 s.
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
    terminations: Counter[str] = Counter()
    repeated_near: Counter[str] = Counter()  # the crash kinds near each repeated callback
    for protocol, keys in records.items():
        for rollout_id, key in keys.items():
            record = client.hgetall(key)
            terminations[record.get("terminations", "0")] += 1
            _check_record(report, nemesis, trainers[protocol], protocol, rollout_id, record)
            if protocol == "v1":
                calls = callbacks.get(rollout_id, [])
                near = _check_callbacks(report, nemesis, rollout_id, record, calls)
                repeated_near.update(near if len(calls) > 1 else [])
            if client.pttl(key) <= 0:
                report.fail(f"{key}: no TTL ({client.pttl(key)})")
    _check_leftovers(report, stage, client, trainers)
    client.close()
    report.figures = {
        **_status_figures(statuses, trainers),
        "terminations": dict(terminations),
        "v1_callbacks": sum(len(c) for c in callbacks.values()),
        "v1_repeats": sum(max(0, len(c) - 1) for c in callbacks.values()),
        "v1_repeats_near": dict(repeated_near),
        "crashes": dict(Counter(kind for _, kind in nemesis.crashes)),
        "failovers": stage.failovers,
        "faults": nemesis.log,
        "fault_errors": nemesis.errors,
    }
    return report


def _check_leftovers(
    report: Report, stage: Stage, client: Any, trainers: dict[Protocol, Trainer]
) -> None:
    """Nothing left queued, leased or active; every fleet process alive; no answer a
    trainer did not expect (it would have given up on that rollout)."""
    for protocol, trainer in trainers.items():
        for error in trainer.errors[:10]:
            report.fail(f"{protocol} trainer: {error}")
    for protocol in ("v1", "v2"):
        for index in ("leases", "active"):
            if left := client.zcard(f"{PREFIX[protocol]}:{index}"):
                report.fail(f"{protocol}: {left} entries left in {index}")
        if left := client.llen(QUEUE[protocol]):
            report.fail(f"{protocol}: {left} messages left in its queue")
        for name, process in stage.fleets[protocol].processes.items():
            if not process.alive():
                report.fail(f"{protocol} {name} died by itself")


def _status_figures(
    statuses: dict[Protocol, dict[str, str]], trainers: dict[Protocol, Trainer]
) -> dict[str, Any]:
    """How admitted rollouts ended: lost (no record), stuck (not terminal), refusals seen."""
    unfinished = TERMINAL | {"missing"}
    return {
        "statuses": {p: dict(Counter(by.values())) for p, by in statuses.items()},
        "admitted": {p: len(t.admitted) for p, t in trainers.items()},
        "lost": {p: sum(s == "missing" for s in by.values()) for p, by in statuses.items()},
        "stuck": {p: sum(s not in unfinished for s in by.values()) for p, by in statuses.items()},
        "orphaned_v2": len(trainers["v2"].orphaned),
        "refusals": {p: dict(t.rejections) for p, t in trainers.items()},
        "trainer_errors": sum(len(t.errors) for t in trainers.values()),
    }


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
) -> list[str]:
    """Checks one v1 rollout's callbacks; the kinds of the crashes near its first one."""
    if not calls:
        report.fail(f"v1 {rollout_id}: no callback ({record.get('status')})")
        return []
    keys = {{k.lower(): v for k, v in c["headers"].items()}.get("idempotency-key") for c in calls}
    if keys != {record.get("admit_token")}:  # one key per admission, on every repeat
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
    return crashes


__all__ = ["CRASH_WINDOW_AFTER", "CRASH_WINDOW_BEFORE", "Report", "check"]
