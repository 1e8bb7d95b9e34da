"""The invariants, checked against every rollout's history once the schedule ran: its record
in Redis (status, result, delivery), the callbacks the mock TrainGate received (v1), every
terminal poll of the trainer and one more by the checker (v2), and which execution held it
when its callback went out (``observe.Holders``); and what each rollout's row asks: every
successful result must be the right one for it (``expected``), not merely agree with the rest.

Each violation has a kind (``KINDS``), so a test can tell what the checker found."""

from __future__ import annotations

import json
import operator
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rollout_sdk.config.settings import RolloutClientSettings
from rollout_worker.delivery import ENDED_ON_THE_WIRE, TIMED_OUT
from tests.chaos.harness import TERMINAL, Protocol
from tests.nemesis.faults import LEASE, Crash, Nemesis
from tests.nemesis.observe import Holders, PollingTrainer, poll_once
from tests.nemesis.stage import PREFIX, QUEUE, Stage

# A v1 callback may repeat only if the execution that posted it could not record its outcome:
# its worker was kill -9-ed (or outlived a SIGTERM's grace and was killed) or stopped past
# its lease from the POST to the write that records it (the POST's arrival to its answer,
# ``callback_delay`` later), or a failover lost that write (up to ``replica_lag`` before the
# kill). SLACK widens that window on both sides: the holders are sampled, the machine loaded.
EXCUSES = frozenset({"kill9", "sigterm_killed", "sigstop", "failover"})
SLACK = 1.0
# A repeat arrives within a lease, a sweep and a claim of the crash that caused it.
REPEAT_SECONDS = LEASE + 5.0
KINDS = (
    "lost",  # an admitted rollout has no record
    "stuck",  # its record never became terminal
    "unfinished",  # the run could not finish: a trainer waiting for a result, the nemesis
    "terminations",  # a record made terminal other than once
    "duplicate_callback",  # a v1 callback repeated without a crash of its holder
    "no_callback",  # a finished v1 rollout whose trainer heard nothing
    "idempotency_key",
    "contradicting_result",  # callbacks, polls and the record disagree
    "wrong_result",  # a successful result is not what its row's agent and responder give
    "cancelled_success",
    "untouched_failure",  # nothing cancelled it, yet it did not succeed
    "no_ttl",
    "leftover",  # queued, leased or active entries left
    "process_died",
    "trainer_error",  # an answer a trainer did not expect
)


@dataclass(frozen=True)
class Violation:
    kind: str
    protocol: str
    rollout_id: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.protocol} {self.rollout_id}: {self.message}"


@dataclass
class Report:
    found: list[Violation] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    replay: str = ""

    def fail(self, kind: str, protocol: str, rollout_id: str, message: str) -> None:
        assert kind in KINDS, kind
        self.found.append(Violation(kind, protocol, rollout_id, message))

    @property
    def violations(self) -> list[str]:
        return [str(violation) for violation in self.found]

    def kinds(self) -> Counter[str]:
        return Counter(violation.kind for violation in self.found)

    def ids(self, kind: str) -> set[str]:
        return {violation.rollout_id for violation in self.found if violation.kind == kind}

    def summary(self, shown: int = 40) -> str:
        """The figures that say how the run went, the violations, the replay command."""
        keys = (
            "admitted",
            "statuses",
            "lost",
            "stuck",
            "unfinished",
            "crashes",
            "v1_callbacks",
            "v1_repeats",
            "v1_repeats_excused_by",
            "results_judged",
            "delivering_cancels_landed",
            "failovers",
            "run_s",
        )
        lines = [f"{key}: {self.figures[key]}" for key in keys if key in self.figures]
        lines.append(f"{len(self.found)} violations {dict(self.kinds())}")
        lines += [f"  {violation}" for violation in self.violations[:shown]]
        if len(self.found) > shown:
            lines.append(f"  … {len(self.found) - shown} more in the figures file")
        if self.replay:
            lines.append(f"replay: {self.replay}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Window:
    """What the v1 excuse needs to know of the run."""

    callback_delay: float = 0.0
    replica_lag: float = 0.0


def check(
    stage: Stage,
    nemesis: Nemesis,
    trainers: dict[Protocol, PollingTrainer],
    holders: Holders,
    deadline: float,
    window: Window,
    report: Report | None = None,
) -> Report:
    """Wait (until ``deadline``, monotonic) for every admitted rollout to end and for repeats to
    arrive, then check every rollout; ``report`` may hold what the run found already."""
    report = report or Report()
    client = stage.redis()
    records = {
        protocol: {i: stage.record_key(protocol, i) for i in trainer.admitted}
        for protocol, trainer in trainers.items()
    }
    began = time.monotonic()
    statuses = _settle(client, records, deadline)
    settled = time.monotonic()
    callbacks = _v1_callbacks(stage, set(records["v1"]), nemesis, deadline)
    holders.stop()
    called = time.monotonic()
    final_polls = _final_polls(stage, trainers["v2"], statuses["v2"])
    report.figures["check_s"] = {
        "settle": round(settled - began, 1),
        "callbacks": round(called - settled, 1),
        "final_polls": round(time.monotonic() - called, 1),
    }
    rows = {p: {body["rollout_id"]: body for body in t.bodies} for p, t in trainers.items()}
    terminations: Counter[str] = Counter()
    excused: Counter[str] = Counter()
    judged: Counter[str] = Counter()
    for protocol, keys in records.items():
        for rollout_id, key in keys.items():
            record: dict[str, str] = client.hgetall(key)  # type: ignore[assignment]
            terminations[record.get("terminations", "0")] += 1
            if not _check_record(report, nemesis, protocol, rollout_id, record):
                continue
            if protocol == "v1":
                calls = callbacks.get(rollout_id, [])
                excused.update(
                    _check_callbacks(report, nemesis, holders, window, key, record, calls)
                )
                results = [call["body"] for call in calls]
            else:
                polls = trainers["v2"].polls.get(rollout_id, []) + final_polls.get(rollout_id, [])
                _check_polls(report, trainers["v2"], rollout_id, record, polls)
                results = polls
            row = rows[protocol][rollout_id]
            judged[protocol] += _check_right(report, protocol, row, [_stored(record), *results])
            if client.pttl(key) <= 0:
                report.fail("no_ttl", protocol, rollout_id, f"{key}: TTL {client.pttl(key)}")
    _check_leftovers(report, stage, client, trainers)
    client.close()
    report.figures |= {
        **_status_figures(statuses, trainers),
        "terminations": dict(terminations),
        "results_judged": dict(judged),  # rollouts whose successful results were judged
        "v1_callbacks": sum(len(c) for c in callbacks.values()),
        "v1_repeats": sum(max(0, len(c) - 1) for c in callbacks.values()),
        "v1_repeats_excused_by": dict(excused),
        "v2_terminal_polls": sum(len(p) for p in trainers["v2"].polls.values())
        + sum(len(p) for p in final_polls.values()),
        "crashes": dict(Counter(crash.kind for crash in nemesis.crashes)),
        "crash_log": [crash.describe() for crash in nemesis.crashes],
        "delivering_cancels": nemesis.delivering_cancels,
        "delivering_cancels_landed": sum(c["landed"] for c in nemesis.delivering_cancels),
        "holder_samples": holders.samples,
        "failovers": stage.failovers,
        "faults": nemesis.log,
        "fault_errors": nemesis.errors,
        "violation_kinds": dict(report.kinds()),
    }
    return report


def _check_leftovers(
    report: Report, stage: Stage, client: Any, trainers: dict[Protocol, PollingTrainer]
) -> None:
    """Nothing left queued, leased or active; every fleet process alive; no answer a
    trainer did not expect (it would have given up on that rollout)."""
    for protocol, trainer in trainers.items():
        for error in trainer.errors[:10]:
            rollout_id, _, message = error.partition(": ")
            report.fail("trainer_error", protocol, rollout_id, message)
    for protocol in ("v1", "v2"):
        for index in ("leases", "active"):
            if left := client.zrange(f"{PREFIX[protocol]}:{index}", 0, -1):
                report.fail("leftover", protocol, "-", f"{len(left)} left in {index}: {left[:5]}")
        if left := client.llen(QUEUE[protocol]):
            report.fail("leftover", protocol, "-", f"{left} messages left in its queue")
        for name, process in stage.fleets[protocol].processes.items():
            if not process.alive():
                report.fail("process_died", protocol, "-", f"{name} died by itself")


def _status_figures(
    statuses: dict[Protocol, dict[str, str]], trainers: dict[Protocol, PollingTrainer]
) -> dict[str, Any]:
    """How admitted rollouts ended: lost (no record), stuck (not terminal), refusals seen."""
    unfinished = TERMINAL | {"missing"}
    return {
        "statuses": {p: dict(Counter(by.values())) for p, by in statuses.items()},
        "admitted": {p: len(t.admitted) for p, t in trainers.items()},
        "lost": {p: sum(s == "missing" for s in by.values()) for p, by in statuses.items()},
        "stuck": {p: sum(s not in unfinished for s in by.values()) for p, by in statuses.items()},
        "unfinished": {p: len(t.unfinished()) for p, t in trainers.items()},
        "orphaned_v2": len(trainers["v2"].orphaned),
        "refusals": {p: dict(t.rejections) for p, t in trainers.items()},
        "trainer_errors": sum(len(t.errors) for t in trainers.values()),
    }


def _settle(
    client: Any, records: dict[Protocol, dict[str, str]], deadline: float
) -> dict[Protocol, dict[str, str]]:
    """Wait until every admitted rollout is terminal (or ``deadline`` passed)."""
    while True:
        statuses = {
            protocol: {i: client.hget(k, "status") or "missing" for i, k in keys.items()}
            for protocol, keys in records.items()
        }
        done = all(s in TERMINAL for by in statuses.values() for s in by.values())
        if done or time.monotonic() > deadline:
            return statuses
        time.sleep(0.5)


def _v1_callbacks(
    stage: Stage, admitted: set[str], nemesis: Nemesis, deadline: float
) -> dict[str, list[dict[str, Any]]]:
    """Each v1 rollout's answered callbacks, once every admitted one has one (or ``deadline``
    passed) and a repeat of the last crash or callback would have arrived. Only callbacks the
    trainer accepted (200) count: one it refused (a TrainGate fault's 5xx) was not delivered,
    and the protocol retries it."""
    while True:
        calls = [c for c in stage.trainer.calls("completed") if c["status"] == 200]
        if admitted <= {c["rollout_id"] for c in calls} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    latest = max([c["at"] for c in calls] + [crash.until for crash in nemesis.crashes] + [0.0])
    time.sleep(max(0.0, min(latest + REPEAT_SECONDS - time.time(), REPEAT_SECONDS)))
    by_id: dict[str, list[dict[str, Any]]] = {}
    for call in stage.trainer.calls("completed"):
        if call["status"] == 200:
            by_id.setdefault(call["rollout_id"], []).append(call)
    return by_id


def _final_polls(
    stage: Stage, trainer: PollingTrainer, statuses: dict[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """One more poll of every finished v2 rollout whose lease token the trainer holds."""
    gateways = stage.fleets["v2"].gateway_urls
    finished = [(i, token) for i, token in trainer.tokens.items() if statuses.get(i) in TERMINAL]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda one: poll_once(gateways, *one), finished))
    return {i: [r] for (i, _), r in zip(finished, results, strict=True) if r is not None}


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
    protocol: Protocol,
    rollout_id: str,
    record: dict[str, str],
) -> bool:
    """The record's own invariants; whether it is terminal (its results can be compared)."""
    status = record.get("status")
    if status is None:
        report.fail("lost", protocol, rollout_id, "admitted, no record")
        return False
    if status not in TERMINAL:
        held = record.get("execution") or "nobody"
        report.fail("stuck", protocol, rollout_id, f"{status}, held by {held}")
        return False
    if record.get("terminations") != "1":
        report.fail(
            "terminations", protocol, rollout_id, f"terminated {record.get('terminations')} times"
        )
    if record.get("cancel_requested") and status == "success":
        report.fail("cancelled_success", protocol, rollout_id, "cancelled, yet success")
    touched = _touched(nemesis, protocol, rollout_id, int(record.get("accepted_at", 0)))
    orphaned = rollout_id in nemesis.trainers["v2"].orphaned
    if not touched and not orphaned and status != "success":
        result = (record.get("result") or "")[:300]
        report.fail("untouched_failure", protocol, rollout_id, f"{status}: {result}")
    return True


def _stored(record: dict[str, str]) -> Any:
    try:
        return json.loads(record.get("result") or "null")
    except ValueError:
        return record.get("result")


def _check_polls(
    report: Report,
    trainer: PollingTrainer,
    rollout_id: str,
    record: dict[str, str],
    polls: list[dict[str, Any]],
) -> None:
    """Every terminal poll of a v2 rollout returned the record's result, and the same one."""
    if not polls:
        if rollout_id not in trainer.orphaned:
            report.fail("unfinished", "v2", rollout_id, "the trainer never got its result")
        return
    stored, status = _stored(record), record.get("status")
    statuses = [poll.get("status") for poll in polls]
    if any(poll != polls[0] for poll in polls):
        report.fail("contradicting_result", "v2", rollout_id, f"polls disagree: {statuses}")
    if any(poll != stored for poll in polls) or any(s != status for s in statuses):
        report.fail(
            "contradicting_result",
            "v2",
            rollout_id,
            f"polled {statuses}, the record says {status}: {str(stored)[:200]}",
        )


@dataclass(frozen=True)
class Expected:
    """What a right run gives a row: the nemesis's agents chat once (``run.bodies``), and the
    mock TrainGate's calculator answers the row's question (``run.question``); the v2 grader
    gives 1.0 to an answer that says the row's label, else 0.0."""

    messages: list[dict[str, Any]]
    label: str | None = None  # v2
    reward: float | None = None  # v2


_QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")
_SIGNS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def expected(protocol: Protocol, row: dict[str, Any]) -> Expected:
    """The right result of ``row``, worked out from its question, not by asking the mock."""
    messages = list(row["messages" if protocol == "v1" else "initial_messages"])
    asked = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
    found = _QUESTION.fullmatch(asked)
    if found is None:
        raise ValueError(f"{row['rollout_id']}: no question the checker can answer: {asked!r}")
    answer = _SIGNS[found.group(2)](int(found.group(1)), int(found.group(3)))
    messages.append({"role": "assistant", "content": f"#### {answer}"})
    if protocol == "v1":
        return Expected(messages)
    label = row["label"]
    return Expected(messages, label, 1.0 if label == str(answer) else 0.0)


def _check_right(
    report: Report, protocol: Protocol, row: dict[str, Any], results: list[Any]
) -> int:
    """Every successful result of a rollout (its stored one, each v1 callback that says
    COMPLETED, each v2 poll that says success) is the right one for its row: one
    ``wrong_result`` naming the first difference. Whether any was judged (1 or 0)."""
    right = expected(protocol, row)
    succeeded = "COMPLETED" if protocol == "v1" else "success"
    judged = [r for r in results if isinstance(r, dict) and r.get("status") == succeeded]
    for result in judged:
        if wrong := _wrong(protocol, right, result):
            report.fail("wrong_result", protocol, row["rollout_id"], wrong)
            break
    return int(bool(judged))


def _wrong(protocol: Protocol, right: Expected, result: dict[str, Any]) -> str | None:
    """How ``result`` differs from the right one; ``None`` if it does not."""
    if protocol == "v1":
        return _messages_differ("final_messages", result.get("final_messages"), right.messages)
    sample = result.get("sample")
    if not isinstance(sample, dict):
        return f"a success without a sample: {str(result)[:200]}"
    differs = [_messages_differ("messages", sample.get("messages"), right.messages)]
    if sample.get("label") != right.label:
        differs.append(f"label {sample.get('label')!r}, the row's is {right.label!r}")
    if sample.get("reward") != right.reward:
        differs.append(f"reward {sample.get('reward')!r}, a right run's is {right.reward!r}")
    return "; ".join(d for d in differs if d) or None


def _messages_differ(name: str, got: Any, right: list[dict[str, Any]]) -> str | None:
    if got == right:
        return None
    answer = right[-1]["content"]
    if not isinstance(got, list) or not got:
        return f"{name} {got!r}, the row's answer is {answer!r}"
    if len(got) != len(right):
        last = str(got[-1])[:120]
        return f"{len(got)} {name}, the last {last}; a right run's {len(right)} end {answer!r}"
    index = next(i for i, (g, r) in enumerate(zip(got, right, strict=True)) if g != r)
    return f"{name}[{index}] is {str(got[index])[:120]}, a right run's {str(right[index])[:120]}"


def _check_callbacks(
    report: Report,
    nemesis: Nemesis,
    holders: Holders,
    window: Window,
    key: str,
    record: dict[str, str],
    calls: list[dict[str, Any]],
) -> list[str]:
    """Checks one finished v1 rollout's callbacks against its record and each other; the
    kinds of the crashes that excuse its repeats."""
    rollout_id = record.get("rollout_id") or key.split(":", 2)[2]
    status, delivery = record.get("status"), record.get("delivery", "")
    if not calls:
        report.fail("no_callback", "v1", rollout_id, f"{status}, delivery: {delivery!r}")
        return []
    keys = {{k.lower(): v for k, v in c["headers"].items()}.get("idempotency-key") for c in calls}
    if keys != {record.get("admit_token")}:  # one key per admission, on every repeat
        report.fail("idempotency_key", "v1", rollout_id, f"Idempotency-Key {keys}")
    stored = _stored(record)
    said = [c["body"].get("status") for c in calls]
    if any(c["body"] != calls[0]["body"] for c in calls):
        report.fail("contradicting_result", "v1", rollout_id, f"callbacks disagree: {said}")
    if any(c["body"] != stored for c in calls):
        report.fail(
            "contradicting_result", "v1", rollout_id, f"callbacks {said} differ from the stored"
        )
    if any((s == "COMPLETED") != (status == "success") for s in said):
        report.fail("contradicting_result", "v1", rollout_id, f"called back {said}, {status}")
    allowed = _attempts_the_record_allows(delivery)
    if allowed is None:
        report.fail(
            "contradicting_result",
            "v1",
            rollout_id,
            f"{len(calls)} callbacks answered 200, the record says delivery {delivery!r}",
        )
        allowed = 1
    if len(calls) <= allowed:  # the record says the trainer may have received this many
        return ["client_timeout"] * (len(calls) - 1)
    # Beyond what the record allows, each repeat needs a crash of its own.
    arrivals = sorted(calls, key=lambda c: c["at"])[: len(calls) - allowed + 1]
    excused = _excuse_repeats(report, nemesis, holders, window, key, rollout_id, arrivals)
    return ["client_timeout"] * (allowed - 1) + excused


# One delivery's attempts when each times out: the first and the SDK's retries
# (OSMOSIS_ROLLOUT_CLIENT_COMPLETE_ROLLOUT_RETRIES, as the nemesis stage leaves it).
TIMED_OUT_ATTEMPTS = 1 + RolloutClientSettings.model_fields["complete_rollout_retries"].default
_DELIVERED_ON = re.compile(
    r"delivered on attempt (\d+); the trainer may have received the \d+ before"
)
# Every deliverer stopped before recording the answer: each callback needs a crash.
ENDED_BY_CRASHES = re.compile(
    r"not delivered: \d+ (?:try|tries), each ended by its worker stopping"
)


def _attempts_the_record_allows(delivery: str) -> int | None:
    """How many callbacks, without a crash, the record's delivery line says the trainer may
    have received: the attempts of its one live delivery. ``None``: a line that says no
    callback was accepted."""
    if delivery == "delivered" or ENDED_BY_CRASHES.match(delivery):
        return 1
    if found := _DELIVERED_ON.fullmatch(delivery):
        return int(found.group(1))
    if delivery == TIMED_OUT:
        return TIMED_OUT_ATTEMPTS
    # Ended by its own execution with its POST on the wire (a fault, a stop): that many went.
    if found := ENDED_ON_THE_WIRE.fullmatch(delivery):
        return int(found.group(1))
    return None


def _excuse_repeats(
    report: Report,
    nemesis: Nemesis,
    holders: Holders,
    window: Window,
    key: str,
    rollout_id: str,
    calls: list[dict[str, Any]],
) -> list[str]:
    """Each callback but the last needs a crash of its own that explains the next one."""
    arrivals = sorted(c["at"] for c in calls)
    used: list[Crash] = []
    for at in arrivals[:-1]:
        held = holders.around(key, at, before=LEASE + 3, after=window.callback_delay + SLACK)
        crash = _excuse(at, {h.pid for h in held}, nemesis.crashes, window, used)
        if crash is None:
            near = [
                f"{c.kind} {c.protocol or 'redis'} {c.name} pid {c.pid} at {c.at - at:+.1f}s"
                for c in nemesis.crashes
                if abs(c.at - at) <= 15
            ]
            holding = sorted({f"{h.execution} ({h.status})" for h in held})
            report.fail(
                "duplicate_callback",
                "v1",
                rollout_id,
                f"{len(calls)} callbacks; none of its holders {holding} crashed in the window "
                f"of the one at {time.strftime('%H:%M:%S', time.localtime(at))}"
                f" (crashes within 15 s: {near or 'none'})",
            )
            return [crash.kind for crash in used]
        used.append(crash)
    return [crash.kind for crash in used]


def _excuse(
    at: float, pids: set[int], crashes: list[Crash], window: Window, used: list[Crash]
) -> Crash | None:
    """A crash (not already used) that explains a repeat of the callback that arrived ``at``,
    sent by one of the executions of ``pids``."""
    low, high = at - SLACK, at + window.callback_delay + SLACK
    for crash in crashes:
        if crash in used or crash.kind not in EXCUSES:
            continue
        if crash.kind == "failover" and low <= crash.at <= high + window.replica_lag:
            return crash
        if crash.pid not in pids:
            continue
        if crash.kind == "sigstop":
            if crash.until - crash.at > LEASE and crash.at <= high and crash.until >= low:
                return crash
        elif low <= crash.at <= high:
            return crash
    return None


__all__ = [
    "EXCUSES",
    "KINDS",
    "SLACK",
    "Expected",
    "Report",
    "Violation",
    "Window",
    "check",
    "expected",
]
