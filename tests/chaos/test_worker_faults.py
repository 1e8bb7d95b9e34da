"""Chaos: workers die. ``kill -9`` three times during one run, at random moments."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Trainer, audit, chaos_bodies, record_figures

ROLLOUTS = 200


def test_three_kill_9s_during_a_run_lose_and_duplicate_nothing(start_chaos: StartChaos) -> None:
    chaos = start_chaos(workers=3, concurrency=20)
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=(1, 4))
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies).start()
    killed, takeovers, crashes = [], [], []
    with ThreadPoolExecutor(3) as watchers:  # each kill's takeover is timed while the next comes
        for _ in range(3):
            time.sleep(random.uniform(1.0, 2.5))
            workers = [n for n in chaos.fleet.processes if n.startswith("worker")]
            victim = random.choice([n for n in workers if chaos.held_by(n)] or workers)
            pid, doomed = chaos.fleet.processes[victim].pid, chaos.held_by(victim)
            crashes.append(chaos.kill_worker(victim))
            killed.append(f"{victim} holding {len(doomed)}")
            takeovers.append(watchers.submit(chaos.wait_taken_over, doomed, pid))
        recovery = [round(takeover.result(), 1) for takeover in takeovers]
    outcome = audit(chaos, trainer, crashes=crashes)
    assert outcome.completed == ROLLOUTS
    assert outcome.reruns > 0, "the kills caught no rollout mid-flight"
    record_figures("kill-9-x3", chaos.protocol, outcome, killed=killed, taken_over_after_s=recovery)


def test_a_sigterm_mid_run_hands_rollouts_to_other_workers(start_chaos: StartChaos) -> None:
    """A deploy: the worker stops taking work, lets running rollouts finish for the grace
    period, hands the rest back, and exits; the others finish them."""
    chaos = start_chaos(
        workers=3, concurrency=20, env={"ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS": "1"}
    )
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=(1.5, 4))
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies).start()
    time.sleep(3)
    victim = chaos.fleet.processes["worker-1"]
    victim_pid = victim.pid
    store = chaos.redis()
    held = chaos.held_by("worker-1")
    assert held, "the victim ran nothing when it was stopped"
    stopping_at = time.monotonic()
    assert victim.stop(grace=60) == 0  # a clean exit, long before the 60 s SIGKILL
    stopped_in = time.monotonic() - stopping_at
    assert chaos.fleet.restart_dead_workers() == ["worker-1"]  # the new version comes up

    outcome = audit(chaos, trainer)
    assert outcome.completed == ROLLOUTS
    handed = [record for record in held if store.hget(record, "handoffs") == "1"]
    assert handed, "nothing was handed back"
    for record in handed:
        assert f":{victim_pid}:" not in store.hget(record, "worker")  # finished elsewhere
        assert store.hget(record, "attempt") == "1"  # a hand-back is not a crash
    record_figures(
        "sigterm",
        chaos.protocol,
        outcome,
        held_at_sigterm=len(held),
        handed_back=len(handed),
        worker_stopped_in_s=round(stopped_in, 1),
    )
