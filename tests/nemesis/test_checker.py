"""The checker can fail: each kind of broken promise, planted in a running nemesis stage, is
reported as its own kind of violation, and a clean run of the same size reports none.

Both runs get the same two faults, neither of which may excuse a repeated v1 callback: a v2
worker stopped past its lease (the other fleet) and a graceful SIGTERM of a v1 worker (it
hands back cleanly). The planted run also:

* loses a v1 rollout (its record deleted while it runs): ``lost``;
* leaves a v2 rollout running forever (its record taken by a rogue execution whose lease is
  renewed until the check is done): ``stuck``, and its trainer never finishes: ``unfinished``;
* rewrites a finished v2 rollout's status and result between its trainer's first terminal
  poll and its next, then restores them: the record agrees with the first poll (all the
  checker before this one compared), the polls disagree: ``contradicting_result``;
* posts three finished v1 rollouts' stored completion bodies to the TrainGate a second time,
  as a rogue worker would: one whose first callback came shortly before the v2 stop, one
  shortly before the SIGTERM, one far from both: ``duplicate_callback`` each. (The first two
  are ones the checker before this one excused: any crash of any kind, in either fleet, from
  1 s before to 10 s after the first callback; the test shows they fall in that window.)
* switches the mock TrainGate's responder from the calculator to the keyword one once the two
  faults are in: every rollout that chats after that ends a success whose answer is wrong for
  its row, the same in its record, its callbacks and its polls (the checker before this one
  compared only those): ``wrong_result``, for those rollouts and none that chatted before.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rollout_core.store.schema import Keys
from tests.chaos.harness import Protocol
from tests.nemesis.checker import (
    REPEAT_SECONDS,
    TIMED_OUT_ATTEMPTS,
    Report,
    Window,
    _check_callbacks,
    _check_polls,
    _check_right,
    expected,
)
from tests.nemesis.faults import Fault, Nemesis
from tests.nemesis.observe import Holders, PollingTrainer
from tests.nemesis.run import WRONG_LABEL_EVERY, Size, bodies, run
from tests.nemesis.stage import PREFIX, Stage

SIZE = Size(rollouts=40, faults=0, duration=20, callback_delay=0.3, settle=25)
SEED = 7
# The rule of the checker before: a crash in [first callback - 1 s, first callback + 10 s].
OLD_WINDOW = (1.0, 10.0)


class Planter:
    """The plant: applies the two faults, and (if ``breaks``) breaks the promise."""

    def __init__(self, breaks: bool) -> None:
        self.breaks = breaks
        self.label = "planted" if breaks else "clean"  # names the run's figures file
        self.planted: dict[str, Any] = {}
        self.errors: list[str] = []
        self.chats: list[dict[str, Any]] = []  # the TrainGate's chat calls, the latest seen

    def __call__(self, *stage_trainers_nemesis_done: Any) -> None:
        try:
            self._plant(*stage_trainers_nemesis_done)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _plant(
        self,
        stage: Stage,
        trainers: dict[Protocol, PollingTrainer],
        nemesis: Nemesis,
        done: threading.Event,
    ) -> None:
        client = stage.redis()
        time.sleep(2)
        if self.breaks:
            self.planted["lost"] = self._lose(client)
            self.planted["stuck"] = self._strand(stage, client, done)
        self._first_callbacks(stage, after=0, count=3)  # some to precede the stop
        stopped_at = time.time()
        nemesis.apply(Fault(at=0, kind="sigstop", protocol="v2", index=1, pick=0.0))
        time.sleep(2)
        terminated_at = time.time()
        nemesis.apply(Fault(at=0, kind="sigterm", protocol="v1", index=1, pick=0.0))
        self.planted["faults"] = (stopped_at, terminated_at)
        if not self.breaks:
            return
        self.planted["misled"] = self._mislead(stage)
        self.planted["contradicting"] = self._contradict(client, trainers["v2"])
        firsts = self._first_callbacks(stage, after=terminated_at + OLD_WINDOW[0] + 1)
        near_stop = _first_within(firsts, stopped_at - OLD_WINDOW[1], stopped_at)
        near_term = _first_within(firsts, stopped_at + 1, terminated_at)
        far = _first_within(firsts, terminated_at + OLD_WINDOW[0] + 1, float("inf"))
        self.planted["duplicates"] = {"near_stop": near_stop, "near_term": near_term, "far": far}
        for rollout_id in (near_stop, near_term, far):
            self._repost(stage, client, rollout_id)
        self.planted["firsts"] = {i: firsts[i] for i in (near_stop, near_term, far)}
        self._watch_chats(stage, done)

    @staticmethod
    def _mislead(stage: Stage) -> tuple[float, float]:
        """From now on the mock TrainGate answers with the keyword responder: a chat that
        should end in the row's ``#### <answer>`` gets "The calculation is complete." (the
        mock answers a chat as it arrives: one that arrived before is the calculator's)."""
        before = time.time()
        stage.trainer.configure(responder="keyword")
        return before, time.time()

    def _watch_chats(self, stage: Stage, done: threading.Event) -> None:
        """Keep the TrainGate's chat calls until the check is done (the stage stops then)."""
        while not done.wait(0.2):
            try:
                self.chats = stage.trainer.calls("chat")
            except httpx.HTTPError:
                return

    @staticmethod
    def _wait_leased(client: redis.Redis, prefix: str, status: str = "running") -> str:
        for _ in range(200):
            for record in client.zrange(Keys(prefix).leases, 0, -1):
                if client.hget(record, "status") == status:
                    return str(record)
            time.sleep(0.05)
        raise AssertionError(f"no {prefix} rollout {status}")

    def _lose(self, client: redis.Redis) -> str:
        record = self._wait_leased(client, PREFIX["v1"])
        client.delete(record)
        return record.split(":", 2)[2]

    def _strand(self, stage: Stage, client: redis.Redis, done: threading.Event) -> str:
        """A rogue execution takes a running v2 rollout and renews its lease until ``done``."""
        record = self._wait_leased(client, PREFIX["v2"])
        leases = Keys(PREFIX["v2"]).leases
        client.hset(record, "execution", "rogue:1:stuck:00000000")
        client.zadd(leases, {record: time.time() * 1000 + 60_000})

        def renew() -> None:
            while not done.wait(0.5):
                with stage.redis() as renewer:
                    renewer.zadd(leases, {record: time.time() * 1000 + 60_000})

        threading.Thread(target=renew, daemon=True).start()
        return record.split(":", 2)[2]

    def _contradict(self, client: redis.Redis, trainer: PollingTrainer) -> str:
        """Between a finished v2 rollout's first terminal poll and its next (a second later),
        rewrite its status and result; restore them once the next poll has read them. The
        record and the first poll agree: only the polls contradict each other."""
        for _ in range(400):
            polled = sorted(i for i, polls in list(trainer.polls.items()) if len(polls) == 1)
            if polled:
                break
            time.sleep(0.02)
        rollout_id = polled[0]
        record = Keys(PREFIX["v2"]).record("v2", rollout_id)
        status, stored = client.hmget(record, "status", "result")
        result = json.loads(stored or "{}")
        other = "failure" if result.get("status") == "success" else "success"
        rewritten = json.dumps(result | {"status": other})
        client.hset(record, mapping={"status": other, "result": rewritten})
        for _ in range(200):
            if len(trainer.polls[rollout_id]) > 1:
                break
            time.sleep(0.02)
        client.hset(record, mapping={"status": status or "", "result": stored or ""})
        self.planted["record_as_first_poll"] = (
            trainer.polls[rollout_id][0] == json.loads(stored or "{}")
            and len(trainer.polls[rollout_id]) > 1
        )
        return rollout_id

    @staticmethod
    def _first_callbacks(stage: Stage, after: float, count: int = 1) -> dict[str, float]:
        """Each v1 rollout's first answered callback, once ``count`` came later than
        ``after``."""
        for _ in range(300):
            calls = [c for c in stage.trainer.calls("completed") if c["status"] == 200]
            firsts: dict[str, float] = {}
            for call in sorted(calls, key=lambda c: c["at"]):
                firsts.setdefault(call["rollout_id"], call["at"])
            if sum(at > after for at in firsts.values()) >= count:
                return firsts
            time.sleep(0.1)
        raise AssertionError("no v1 callback after the faults")

    @staticmethod
    def _repost(stage: Stage, client: redis.Redis, rollout_id: str) -> None:
        """What a rogue worker would do: post the stored completion body once more."""
        record = Keys(PREFIX["v1"]).record("v1", rollout_id)
        stored, key = client.hmget(record, "result", "admit_token")
        response = httpx.post(
            f"{stage.trainer.url}/v1/rollout/completed",
            json=json.loads(stored or "{}"),
            headers={"Idempotency-Key": key or ""},
            timeout=10,
        )
        response.raise_for_status()


def _first_within(firsts: dict[str, float], low: float, high: float) -> str:
    inside = sorted(i for i, at in firsts.items() if low <= at <= high)
    assert inside, f"no first callback in [{low}, {high}]: {firsts}"
    return inside[0]


def test_the_checker_reports_each_planted_fault(tmp_path: Path) -> None:
    planter = Planter(breaks=True)
    report = run(SEED, SIZE, tmp_path, plant=planter)
    planted = planter.planted
    assert not planter.errors, planter.errors
    summary = f"{planted}\n{report.summary()}"
    duplicates = set(planted["duplicates"].values())
    assert report.ids("lost") == {planted["lost"]}, summary
    assert report.ids("stuck") == {planted["stuck"]}, summary
    waited = [v.message for v in report.found if v.kind == "unfinished" and v.protocol == "v2"]
    assert any(planted["stuck"] in message for message in waited), summary  # its trainer
    assert report.ids("contradicting_result") == {planted["contradicting"]}, summary
    assert planted["record_as_first_poll"], summary  # what the old check compared agreed
    assert report.ids("duplicate_callback") == duplicates, summary
    _assert_wrong_results(report, planter, summary)
    # The old rule excused the first two: a crash of any kind in its window.
    stopped_at, terminated_at = planted["faults"]
    firsts = planted["firsts"]
    for name, crash_at in (("near_stop", stopped_at), ("near_term", terminated_at)):
        first = firsts[planted["duplicates"][name]]
        assert first - OLD_WINDOW[0] <= crash_at <= first + OLD_WINDOW[1], (name, summary)
    # A run that could not finish still reports its figures and how to replay it.
    assert report.replay.startswith("uv run python -m tests.nemesis --seed 7"), report.replay
    assert "replay:" in report.summary()
    assert report.figures["admitted"] == {"v1": 20, "v2": 20}
    # Bounded: from the first offer, the settle's deadline, a repeat's wait, the check itself.
    checked = report.figures["phases_s"]["checked"]
    assert checked < SIZE.duration + SIZE.settle + REPEAT_SECONDS + 20, report.figures["phases_s"]


def _assert_wrong_results(report: Report, planter: Planter, summary: str) -> None:
    """``wrong_result`` names every judged rollout whose every chat came after the switch,
    and none whose every chat came before it; in both fleets, with the keyword answer."""
    before, after = planter.planted["misled"]
    chatted: dict[str, list[float]] = {}
    for call in planter.chats:
        chatted.setdefault(call["rollout_id"], []).append(call["at"])
    unjudged = {planter.planted["lost"], planter.planted["stuck"]}
    misled = {i for i, at in chatted.items() if min(at) > after} - unjudged
    told_right = {i for i, at in chatted.items() if max(at) < before}
    wrong = report.ids("wrong_result")
    assert misled <= wrong, (sorted(misled - wrong), summary)
    assert not wrong & told_right, (sorted(wrong & told_right), summary)
    for protocol in ("v1", "v2"):  # a mixed run: right and wrong results in each fleet
        assert any(i.startswith(protocol) for i in misled), (protocol, chatted, summary)
        assert any(i.startswith(protocol) for i in told_right - unjudged), (protocol, summary)
    messages = [v.message for v in report.found if v.kind == "wrong_result"]
    assert all("The calculation is complete." in m for m in messages), messages


def test_a_clean_run_of_the_same_size_reports_none(tmp_path: Path) -> None:
    planter = Planter(breaks=False)
    report = run(SEED, SIZE, tmp_path, plant=planter)
    assert not planter.errors, planter.errors
    assert not report.found, report.summary()
    assert report.figures["crashes"] == {"sigstop": 1, "sigterm": 1}
    assert report.figures["admitted"] == {"v1": 20, "v2": 20}
    assert report.figures["results_judged"] == {"v1": 20, "v2": 20}  # every one was right


def test_a_result_wrong_for_its_row_is_a_wrong_result() -> None:
    """What the fleet returns must be right for the row, not only agree with itself: results
    emptied (v1 ``final_messages``; v2 messages, reward -123), another row's right result, or
    a reward 1.0 for a wrong label are each a ``wrong_result`` naming what differs; the right
    ones (a reward 0.0 for a wrong label among them) are none."""
    rows = {p: bodies(SEED, p, WRONG_LABEL_EVERY + 1, "http://trainer") for p in ("v1", "v2")}

    def right(protocol: Protocol, row: dict[str, Any]) -> dict[str, Any]:
        want = expected(protocol, row)
        if protocol == "v1":
            return {
                "rollout_id": row["rollout_id"],
                "status": "COMPLETED",
                "final_messages": want.messages,
            }
        sample = {"messages": want.messages, "label": want.label, "reward": want.reward}
        return {"rollout_id": row["rollout_id"], "status": "success", "sample": sample}

    def judged(protocol: Protocol, row: dict[str, Any], result: dict[str, Any]) -> list[str]:
        report = Report()
        assert _check_right(report, protocol, row, [result]) == 1
        return report.violations

    for protocol, made in rows.items():
        for row in made:
            assert judged(protocol, row, right(protocol, row)) == [], row
    v1, v2 = rows["v1"][1], rows["v2"][1]
    emptied = judged("v1", v1, right("v1", v1) | {"final_messages": []})
    assert emptied == [
        f"wrong_result: v1 {v1['rollout_id']}: final_messages [], the row's "
        f"answer is {expected('v1', v1).messages[-1]['content']!r}"
    ]
    planted = right("v2", v2)
    planted["sample"] |= {"messages": [], "reward": -123.0}
    (found,) = judged("v2", v2, planted)
    assert found.startswith(f"wrong_result: v2 {v2['rollout_id']}: messages []"), found
    assert "reward -123.0, a right run's is 1.0" in found, found
    (swapped,) = judged("v1", v1, right("v1", rows["v1"][2]) | {"rollout_id": v1["rollout_id"]})
    assert "final_messages[0]" in swapped, swapped
    mislabelled = rows["v2"][0]  # the row's label is wrong: a right run grades it 0
    assert expected("v2", mislabelled).reward == 0.0
    generous = right("v2", mislabelled)
    generous["sample"] |= {"reward": 1.0}
    assert judged("v2", mislabelled, generous) == [
        f"wrong_result: v2 {mislabelled['rollout_id']}: reward 1.0, a right run's is 0.0"
    ]
    refused = {"rollout_id": v1["rollout_id"], "status": "ERROR", "final_messages": []}
    report = Report()
    assert _check_right(report, "v1", v1, [refused]) == 0  # only successes are judged
    assert report.found == []


def test_a_final_poll_refused_or_not_terminal_is_a_contradicting_result() -> None:
    """Every poll must return the terminal result: the checker's own last poll answering 409
    (or a status that is not terminal) is a violation, not a poll to drop."""
    record = {"status": "success", "result": json.dumps({"status": "success", "reward": 1.0})}
    first = json.loads(record["result"])
    for last in ({"status": "answered 409", "body": "lease"}, {"status": "running"}):
        report = Report()
        _check_polls(report, PollingTrainer.__new__(PollingTrainer), "r1", record, [first, last])
        assert [v.kind for v in report.found] == ["contradicting_result"] * 2, report.found
    agreeing = Report()
    _check_polls(agreeing, PollingTrainer.__new__(PollingTrainer), "r1", record, [first, first])
    assert agreeing.found == []


@pytest.mark.parametrize(
    ("delivery", "allowed"),
    [
        ("delivered", 1),
        ("delivered on attempt 2; the trainer may have received the 1 before", 2),
        ("delivered on attempt 3; the trainer may have received the 2 before", 3),
        ("failed: the trainer did not answer in time (it may have received the callback)", 3),
        (
            "failed: the worker stopped before the trainer answered, after its callback went "
            "out 1 time (the trainer may have it)",
            1,
        ),
        (
            "failed: the worker stopped before the trainer answered, after its callback went "
            "out 2 times (the trainer may have it)",
            2,
        ),
        (
            "not delivered: 1 try, each ended by its worker stopping (crashed or killed) "
            "before the trainer's answer was recorded; the trainer may have received it",
            1,
        ),
    ],
)
def test_a_delivery_line_excuses_no_more_callbacks_than_it_states(
    delivery: str, allowed: int
) -> None:
    """A record's delivery line excuses the attempts of its one live delivery, no more: one
    callback past them, with no crash, is a ``duplicate_callback`` (a line ending a rollout
    with its callback on the wire says how many attempts went out: before, it excused three
    whatever that number was)."""
    assert allowed <= TIMED_OUT_ATTEMPTS
    body = {"rollout_id": "r1", "status": "COMPLETED", "reward": 1.0}
    record = {
        "rollout_id": "r1",
        "status": "success",
        "admit_token": "k1",
        "result": json.dumps(body),
        "delivery": delivery,
    }
    holders = Holders.__new__(Holders)
    holders.seen = {}
    nemesis = Nemesis.__new__(Nemesis)
    nemesis.crashes = []
    for count, found in ((allowed, []), (allowed + 1, ["duplicate_callback"])):
        calls = [
            {"body": body, "headers": {"Idempotency-Key": "k1"}, "at": 50.0 * i}
            for i in range(count)
        ]
        report = Report()
        excused = _check_callbacks(report, nemesis, holders, Window(), "rf:v1:r1", record, calls)
        assert [v.kind for v in report.found] == found, (count, report.found)
        if not found:
            assert excused == ["client_timeout"] * (allowed - 1)
