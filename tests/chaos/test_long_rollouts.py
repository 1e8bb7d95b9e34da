"""Chaos: rollouts longer than the broker's visibility timeout. Celery's Redis transport
hands their messages out again while they still run; the lease turns every such redelivery
away, so each rollout runs once."""

from __future__ import annotations

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
    # Restores happen every VISIBILITY_TIMEOUT: most rollouts are handed out again, some twice.
    assert turned_away > ROLLOUTS // 2, "the broker hardly redelivered running rollouts"
    record_figures(
        "longer-than-visibility-timeout",
        chaos.protocol,
        outcome,
        redeliveries_turned_away=turned_away,
    )
