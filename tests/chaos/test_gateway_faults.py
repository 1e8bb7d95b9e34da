"""Chaos: gateways die. One is killed while admissions stream in and started again; then the
other is killed while trainers long-poll, and started again. Trainers move to the surviving
gateway; a v2 admission whose 202 died with its gateway ends by itself: ``lease_expired`` once
its polling lease lapses, or its own result if that came first."""

from __future__ import annotations

import json
import time

from tests.chaos.conftest import StartChaos
from tests.chaos.harness import CHAOS_ENV, Trainer, audit, chaos_bodies, record_figures

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
    lease_ms = float(CHAOS_ENV["ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS"]) * 1000
    for rollout_id in trainer.orphaned:
        record = store.hgetall(chaos.record_key(rollout_id))
        result = json.loads(record.get("result") or "{}")
        if result.get("err_category") != "lease_expired":
            # nobody polls it: it ends by its own result only if that came before the deadline
            assert result.get("status") == "success", (rollout_id, result)
            assert int(record["finished_at"]) - int(record["accepted_at"]) < lease_ms, record
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
