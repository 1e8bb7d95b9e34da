"""Chaos: agents that misbehave on the event loop their worker shares. Among 200 rollouts,
two block the loop for an hour (``time.sleep``) and three never return. A blocked worker
notices within two thirds of its lease, fails the rollout that blocks it, gives the others
back and exits for its supervisor to restart; the fleet's rollout time limit fails the ones
that never return. Every other rollout completes: nobody is starved."""

from __future__ import annotations

from typing import Any

from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Trainer, audit, chaos_bodies, record_figures
from tests.harness import supervised

ROLLOUTS = 200
BLOCKING = (30, 120)
NEVER_RETURNING = (50, 90, 160)
TIME_LIMIT_SECONDS = 6


def misbehave(body: dict[str, Any], step: dict[str, Any]) -> str:
    script = body["metadata"]["script"]
    script[:] = [step, *script[-1:]] if script[-1].keys() == {"complete"} else [step]
    rollout_id: str = body["rollout_id"]
    return rollout_id


def failure_message(chaos: Any, trainer: Trainer, rollout_id: str) -> str:
    if chaos.protocol == "v1":
        (delivery,) = chaos.trainer.deliveries()[rollout_id]
        assert delivery["status"] == "ERROR"
        message: str = delivery["error_message"]
        return message
    result = trainer.results[rollout_id]
    assert result["status"] == "failure"
    return f"{result['err_category']}: {result['err_message']}"


def test_blocking_and_never_returning_agents_starve_nobody(start_chaos: StartChaos) -> None:
    chaos = start_chaos(
        workers=3,
        concurrency=20,
        env={"ROLLOUT_FLEET_MAX_ROLLOUT_SECONDS": str(TIME_LIMIT_SECONDS)},
    )
    bodies = chaos_bodies(chaos.protocol, chaos.trainer.url, ROLLOUTS, seconds=(0.5, 3))
    blocking = [misbehave(bodies[i], {"block": 3600}) for i in BLOCKING]
    never_returning = [misbehave(bodies[i], {"sleep": 3600}) for i in NEVER_RETURNING]
    with supervised(chaos.fleet) as restarted:
        trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies).start()
        outcome = audit(chaos, trainer, timeout=180)

    assert outcome.completed == ROLLOUTS - len(blocking) - len(never_returning)
    assert len(restarted) == len(blocking)  # the culprit is failed, not run again elsewhere
    for rollout_id in blocking:
        assert "blocked its worker's event loop" in failure_message(chaos, trainer, rollout_id)
    for rollout_id in never_returning:
        message = failure_message(chaos, trainer, rollout_id)
        assert f"limit of {TIME_LIMIT_SECONDS}s" in message
    logs = "".join(process.output() for process in chaos.fleet.processes.values())
    assert logs.count("recycling this worker: its event loop was blocked") == len(blocking)
    assert "time.sleep(argument)" in logs  # the report shows where the loop was stuck
    record_figures(
        "stuck-agents",
        chaos.protocol,
        outcome,
        blocking_agents=len(blocking),
        never_returning_agents=len(never_returning),
        workers_recycled=len(restarted),
    )
