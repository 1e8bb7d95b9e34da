"""The chaos audit can fail: a run judged clean reports nothing, and the same run with
contradictions planted after the trainer had its results reports each, on exactly those
rollouts. Planted: a record whose status changed after its callback or terminal poll, one
whose result changed, and (v1) a rogue extra callback of a stored result."""

from __future__ import annotations

import json

import httpx

from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Protocol, Trainer, chaos_bodies, judge

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
