"""Chaos: Redis misbehaves. Every client connection is cut under load (Celery's Redis
transport then redelivers in-flight messages: the lease must drop the duplicates), and Redis
restarts mid-run (AOF on: everything admitted survives)."""

from __future__ import annotations

import time

from rollout_core.store.schema import Keys
from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Trainer, audit, chaos_bodies, record_figures

ROLLOUTS = 200


def test_cutting_every_redis_connection_under_load(start_chaos: StartChaos) -> None:
    chaos = start_chaos(concurrency=30)
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=(1, 4))
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies).start()
    store = chaos.redis()
    cut = 0
    for _ in range(3):
        time.sleep(1.5)
        for client in store.client_list():
            if client["cmd"] != "monitor" and client["id"] != str(store.client_id()):
                cut += store.client_kill_filter(_id=client["id"])
    outcome = audit(chaos, trainer)
    assert outcome.completed == ROLLOUTS
    record_figures("redis-connections-cut-x3", chaos.protocol, outcome, connections_cut=cut)


def test_a_redis_restart_mid_run_loses_nothing_admitted(start_chaos: StartChaos) -> None:
    chaos = start_chaos(concurrency=30)
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=(1, 4))
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies).start()
    time.sleep(2)
    queued_before = chaos.redis().zcard(Keys(chaos.fleet.key_prefix).active)
    chaos.redis_server.stop()  # SIGTERM: Redis flushes its AOF and exits
    time.sleep(2)
    chaos.redis_server.start()
    outcome = audit(chaos, trainer, timeout=180)
    assert outcome.completed == ROLLOUTS
    record_figures("redis-restart", chaos.protocol, outcome, in_flight_at_restart=queued_before)
