"""Chaos: rollouts longer than the broker's visibility timeout, each run once.

kombu's ack emulation hands a message out again once it has been taken for longer than the
visibility timeout, while its rollout still runs; the lease turned every such redelivery
away. Workers keep the messages they take in memory only (no ``unacked``
copy in Redis: ``rollout_core/queue/broker.py``), so nothing is handed out again at all."""

from __future__ import annotations

from rollout_core.store.schema import UNACKED
from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Trainer, audit, chaos_bodies, record_figures

ROLLOUTS = 200
VISIBILITY_TIMEOUT = 10  # the smallest the settings allow (the broker restores every 10 s)


def test_rollouts_outliving_the_visibility_timeout_run_once(start_chaos: StartChaos) -> None:
    chaos = start_chaos(
        concurrency=ROLLOUTS // 2,
        env={"ROLLOUT_FLEET_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_TIMEOUT)},
    )
    long = (2 * VISIBILITY_TIMEOUT, 2.5 * VISIBILITY_TIMEOUT)
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=long)
    # v2 trainers poll each rollout to its end: 100 at once run the 200 in two waves.
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies, concurrency=100)
    trainer.start()
    outcome = audit(chaos, trainer, timeout=240)
    assert outcome.completed == ROLLOUTS
    assert outcome.reruns == 0
    logs = "".join(process.output() for process in chaos.fleet.processes.values())
    turned_away = logs.count(": not run (busy)")
    # Before, restores every VISIBILITY_TIMEOUT handed most rollouts out again, some twice.
    assert turned_away == 0, "a running rollout's message was handed out again"
    assert chaos.redis().hlen(UNACKED) == 0
    record_figures(
        "longer-than-visibility-timeout",
        chaos.protocol,
        outcome,
        redeliveries_turned_away=turned_away,
    )
