"""Chaos: gateways die. One is killed while admissions stream in and started again; then the
other is killed while trainers long-poll, and started again. Trainers move to the surviving
gateway; a v2 admission whose 202 died with its gateway ends by itself as ``lease_expired``."""

from __future__ import annotations

import json
import time

from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Trainer, audit, chaos_bodies, record_figures

ROLLOUTS = 200


def test_gateways_killed_during_admission_and_long_polls(start_chaos: StartChaos) -> None:
    chaos = start_chaos(concurrency=30)
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=(2, 5))
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies, pace=0.02).start()
    time.sleep(1.5)  # mid-admission: 200 admissions take 4 s
    chaos.fleet.processes["gateway"].kill()
    time.sleep(1)
    chaos.restart_gateway(1)
    time.sleep(4)  # admissions over; trainers long-poll (v2) or wait for callbacks (v1)
    chaos.fleet.processes["gateway-2"].kill()
    time.sleep(1)
    chaos.restart_gateway(2)

    outcome = audit(chaos, trainer, timeout=180)
    store = chaos.redis()
    for rollout_id in trainer.orphaned:
        result = json.loads(store.hget(chaos.record_key(rollout_id), "result") or "{}")
        assert result["err_category"] == "lease_expired"
    assert outcome.completed == outcome.admitted - len(trainer.orphaned)
    assert outcome.admitted == ROLLOUTS
    assert trainer.broken_connections > 0, "the kills cut no request"
    record_figures(
        "gateways-killed",
        chaos.protocol,
        outcome,
        answers_lost_with_a_gateway=len(trainer.orphaned),
        requests_cut_by_a_kill=trainer.broken_connections,
    )
