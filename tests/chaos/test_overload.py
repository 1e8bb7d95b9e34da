"""Chaos: ten times the fleet's capacity offered at once. v2 admission answers 429 with
``Retry-After`` once the queue bound is reached, and trainers come back later; v1 has no 429
(CONFORMANCE #47), so everything queues. Nothing admitted is lost either way, and the queue
(the fleet's memory) never grows past its bound."""

from __future__ import annotations

import threading

import psutil

from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Trainer, audit, chaos_bodies, record_figures

WORKERS, SLOTS = 2, 10
CAPACITY = WORKERS * SLOTS
MAX_QUEUED = 2 * CAPACITY
ROLLOUTS = 10 * CAPACITY


def test_ten_times_capacity_at_once(start_chaos: StartChaos) -> None:
    chaos = start_chaos(
        workers=WORKERS, concurrency=SLOTS, env={"ROLLOUT_FLEET_MAX_QUEUED": str(MAX_QUEUED)}
    )
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=(0.5, 1.5))
    store = chaos.redis()
    deepest, rss = 0, 0
    done = threading.Event()

    def watch() -> None:
        nonlocal deepest, rss
        processes = [psutil.Process(p.pid) for p in chaos.fleet.processes.values()]
        while not done.wait(0.1):
            deepest = max(deepest, store.llen(chaos.queue))
            rss = max(rss, sum(p.memory_info().rss for p in processes))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies, concurrency=ROLLOUTS)
    outcome = audit(chaos, trainer.start(), timeout=240)
    done.set()
    watcher.join()

    assert outcome.completed == ROLLOUTS
    if chaos.protocol == "v2":
        assert trainer.rejections[429] > 0
        assert deepest <= MAX_QUEUED
    else:
        assert 429 not in trainer.rejections
    record_figures(
        "overload-10x",
        chaos.protocol,
        outcome,
        capacity=CAPACITY,
        queue_bound=MAX_QUEUED if chaos.protocol == "v2" else None,
        deepest_queue=deepest,
        answered_429=trainer.rejections[429],
        fleet_peak_rss_mb=round(rss / 2**20),
    )
