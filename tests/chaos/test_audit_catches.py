"""The chaos audit can fail: a run judged clean reports nothing, and the same run with
contradictions planted after the trainer had its results reports each, on exactly those
rollouts. Planted: a record whose status changed after its callback or terminal poll, one
whose result changed, and (v1) a rogue extra callback of a stored result; (v2) a record
that answered another result, or a non-terminal status, to a poll after the trainer's first
terminal one and was put back before the audit read it; (v1) a repeated callback arriving as
late as a takeover's repeat can."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from tests.chaos import harness
from tests.chaos.conftest import StartChaos
from tests.chaos.harness import ChaosFleet, Protocol, Timings, Trainer, chaos_bodies, judge

ROLLOUTS = 12


def test_the_audit_reports_planted_contradictions_and_nothing_on_a_clean_run(
    start_chaos: StartChaos, protocol: Protocol
) -> None:
    chaos = start_chaos(workers=1, gateways=1, concurrency=ROLLOUTS)
    bodies = chaos_bodies(protocol, chaos.trainer.url, ROLLOUTS, seconds=(0.2, 0.6))
    trainer = Trainer(protocol, chaos.fleet.gateway_urls, bodies).start()
    outcome, problems = judge(chaos, trainer, timeout=90)
    assert problems == []
    assert (outcome.lost, outcome.duplicates, outcome.contradictions) == (0, 0, 0), outcome
    assert outcome.completed == ROLLOUTS

    store = chaos.redis()
    flipped, altered, repeated = sorted(trainer.admitted)[:3]
    flipped_key, altered_key = chaos.record_key(flipped), chaos.record_key(altered)
    store.hset(flipped_key, "status", "failure")  # after its callback or poll: a contradiction
    result = json.loads(store.hget(altered_key, "result") or "{}")
    result["reward"] = -1.0 if result.get("reward") != -1.0 else 2.0
    store.hset(altered_key, "result", json.dumps(result))
    planted = {flipped, altered}
    if protocol == "v1":  # a rogue extra callback: the stored result posted again
        stored = store.hget(chaos.record_key(repeated), "result") or ""
        rogue = httpx.post(
            f"{chaos.trainer.url}/v1/rollout/completed",
            content=stored,
            headers={"Content-Type": "application/json"},
        )
        assert rogue.status_code == 200, rogue.text

    outcome, problems = judge(chaos, trainer, timeout=90)
    assert outcome.contradictions == 2, problems
    contradicted = {line.split(":", 1)[0] for line in problems if "callbacks" not in line}
    assert contradicted == planted, problems
    if protocol == "v1":
        assert outcome.duplicates == 1, outcome
        assert any(line.startswith(f"{repeated}: 2 callbacks") for line in problems), problems
    else:
        assert outcome.duplicates == 0, outcome


@pytest.mark.parametrize("protocol", ["v2"])
def test_the_audit_reports_a_later_poll_that_belies_the_first_terminal_one(
    start_chaos: StartChaos, protocol: Protocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the trainer's first terminal polls, one record's result is rewritten and
    another's status goes back to ``running``, for as long as the audit's own poll of every
    rollout takes; then both are put back. The records the audit reads agree with the first
    terminal polls: only the later poll shows each contradiction."""
    chaos = start_chaos(workers=1, gateways=1, concurrency=ROLLOUTS)
    bodies = chaos_bodies(protocol, chaos.trainer.url, ROLLOUTS, seconds=(0.2, 0.6))
    trainer = Trainer(protocol, chaos.fleet.gateway_urls, bodies).start()
    trainer.join(90)  # every rollout's first terminal poll is in
    assert trainer.results.keys() == trainer.admitted == trainer.tokens.keys()

    store = chaos.redis()
    rewritten, regressed = sorted(trainer.admitted)[:2]
    rewritten_key, regressed_key = chaos.record_key(rewritten), chaos.record_key(regressed)
    original = store.hget(rewritten_key, "result") or "{}"
    result = json.loads(original)
    result["reward"] = -1.0 if result.get("reward") != -1.0 else 2.0
    store.hset(rewritten_key, "result", json.dumps(result))
    polled = harness._final_polls

    def planted(fleet: ChaosFleet, polling: Trainer) -> dict[str, dict[str, Any] | None]:
        status = store.hget(regressed_key, "status") or ""
        store.hset(regressed_key, "status", "running")
        try:
            return polled(fleet, polling)
        finally:  # put back before the audit reads the records
            store.hset(rewritten_key, "result", original)
            store.hset(regressed_key, "status", status)
            store.zrem(chaos.keys.polling_leases, regressed_key)

    monkeypatch.setattr(harness, "_final_polls", planted)
    outcome, problems = judge(chaos, trainer, timeout=90)
    assert outcome.contradictions == 2, problems
    assert {line.split(":", 1)[0] for line in problems} == {rewritten, regressed}, problems
    assert any(
        line.startswith(f"{regressed}: polled running after a terminal poll") for line in problems
    ), problems
    assert any(line.startswith(f"{rewritten}: polled success after the run") for line in problems)
    assert (outcome.lost, outcome.duplicates) == (0, 0), outcome


@pytest.mark.parametrize("protocol", ["v1"])
def test_the_audit_waits_for_a_repeat_as_late_as_an_attempt_under_way_can_land(
    start_chaos: StartChaos, protocol: Protocol
) -> None:
    """A rogue repeat of a stored result posted once every rollout was called back, as late
    as an attempt under way when its record ended can arrive (the client timeout after): the
    audit still waits for it."""
    chaos = start_chaos(workers=1, gateways=1, concurrency=ROLLOUTS)
    bodies = chaos_bodies(protocol, chaos.trainer.url, ROLLOUTS, seconds=(0.2, 0.6))
    trainer = Trainer(protocol, chaos.fleet.gateway_urls, bodies).start()
    trainer.join(90)
    deadline = time.monotonic() + 90
    while not trainer.admitted <= chaos.trainer.deliveries().keys():
        assert time.monotonic() < deadline, "the rollouts were never called back"
        time.sleep(0.1)
    delivered = time.monotonic()
    late = Timings.of_fleet(chaos).client_timeout + 1
    repeated = sorted(trainer.admitted)[0]
    stored = chaos.redis().hget(chaos.record_key(repeated), "result") or ""
    answers: list[int] = []

    def repeat_late() -> None:
        time.sleep(max(0.0, delivered + late - time.monotonic()))
        rogue = httpx.post(
            f"{chaos.trainer.url}/v1/rollout/completed",
            content=stored,
            headers={"Content-Type": "application/json"},
        )
        answers.append(rogue.status_code)

    rogue = threading.Thread(target=repeat_late, daemon=True)
    rogue.start()
    outcome, problems = judge(chaos, trainer, timeout=90)
    rogue.join(30)
    assert answers == [200]
    assert outcome.duplicates == 1, (outcome, problems)
    assert any(line.startswith(f"{repeated}: 2 callbacks") for line in problems), problems
    assert (outcome.lost, outcome.contradictions) == (0, 0), (outcome, problems)
