"""A worker frozen past its lease, or killed, while v1 rollouts are delivered: how many
callbacks repeat, and is every repeat inside the window docs/RELIABILITY.md writes down?

Two workers (64 rollouts each at once), 400 calculator rollouts offered over two seconds, a
mock TrainGate answering chats after 100 ms and callbacks at once, production's 15 s lease.
``sigstop`` freezes the worker holding the most rollouts for 30 s; ``kill9`` kills one
twice (the supervisor restarting it in between). Each run reports lost rollouts, repeated
callbacks, whether each repeat was byte-identical and carried its admission's
``Idempotency-Key``, and how long before the fault its first callback reached the trainer
(a repeat is inside the window when the fault came after that callback, before its answer
could be recorded).

    uv run python -m tests.delivery.scenario_freeze --fault sigstop --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from rollout_core.store.schema import Keys
from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from tests.chaos.harness import Trainer
from tests.harness import CALCULATOR_AGENT, calculator_bodies, start_mock_trainer

TERMINAL = {"success", "failure", "cancelled"}


def _holdings(fleet: LocalFleet, store: Any) -> dict[str, list[str]]:
    """Each worker's held rollouts' statuses."""
    held: dict[str, list[str]] = {n: [] for n in fleet.processes if n.startswith("worker")}
    for record in store.zrange(Keys(fleet.key_prefix).leases, 0, -1):
        execution, status = store.hmget(record, "execution", "status")
        for name, statuses in held.items():
            if f":{fleet.processes[name].pid}:" in (execution or ""):
                statuses.append(status or "")
    return held


def _busiest_once_busy(fleet: LocalFleet, store: Any, least: int = 10) -> str:
    """The worker holding the most rollouts, once one holds ``least`` (the fault must catch
    rollouts in flight, whatever the machine's speed)."""
    deadline = time.monotonic() + 60
    while True:
        holdings = _holdings(fleet, store)
        victim = max(holdings, key=lambda name: len(holdings[name]))
        if len(holdings[victim]) >= least or time.monotonic() > deadline:
            return victim
        time.sleep(0.02)


def run_once(fault: str, seed: int, workdir: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    redis_server = RedisServer(appendonly=True, data_dir=workdir / "redis").start()
    mock, trainer = start_mock_trainer("calculator", workdir)
    fleet = LocalFleet(
        agent=CALCULATOR_AGENT,
        redis_url=redis_server.url,
        workers=2,
        concurrency=64,
        log_dir=workdir / "logs",
    )
    try:
        trainer.configure(latency_s=0.1)
        fleet.start()
        store = redis.Redis.from_url(redis_server.url, decode_responses=True)
        bodies = calculator_bodies(trainer.url, 400)
        offered = Trainer("v1", fleet.gateway_urls, bodies, pace=2 / len(bodies)).start()
        faults: list[float] = []
        victim = _busiest_once_busy(fleet, store)
        time.sleep(rng.uniform(0, 0.3))
        held: list[str] = []
        resumed_at: float | None = None
        if fault == "sigstop":
            pid = fleet.processes[victim].pid
            held += _holdings(fleet, store)[victim]
            faults.append(time.time())
            os.kill(pid, signal.SIGSTOP)
            time.sleep(30)
            resumed_at = time.time()
            os.kill(pid, signal.SIGCONT)
        else:
            for _ in range(2):
                held += _holdings(fleet, store)[victim]
                faults.append(time.time())
                fleet.processes[victim].kill()
                fleet.restart_dead_workers()
                time.sleep(rng.uniform(1.0, 3.0))
        offered.join(120)
        keys = {body["rollout_id"]: body["rollout_id"] for body in bodies}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            statuses = [store.hget(Keys(fleet.key_prefix).record("v1", k), "status") for k in keys]
            if all(s in TERMINAL for s in statuses):
                break
            time.sleep(0.5)
        time.sleep(3)  # a last repeat, if any, lands
        calls = trainer.calls("completed")
        figures = _judge(calls, store, fleet.key_prefix, keys, faults, resumed_at)
        figures["held_at_fault"] = len(held)
        figures["delivering_at_fault"] = held.count("delivering")
        return figures
    finally:
        fleet.stop()
        mock.stop()
        redis_server.stop()


def _judge(
    calls: list[dict[str, Any]],
    store: Any,
    prefix: str,
    keys: dict[str, str],
    faults: list[float],
    resumed_at: float | None,
) -> dict[str, Any]:
    """Lost rollouts, repeats and their kind. A repeat is inside the window when its first
    callback reached the trainer before a fault (the faulted worker posted it and never
    recorded the answer); a callback that arrives after a frozen worker resumed, on a
    rollout that already had one, is an avoidable repeat (the resumed worker posted without
    its lease). ``offsets_s``: each repeated rollout's callbacks, seconds after the first
    fault (the mock records a callback when its handler runs, a few ms after it arrives)."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        by_id.setdefault(call["rollout_id"], []).append(call)
    lost = [rollout_id for rollout_id in keys if rollout_id not in by_id]
    repeats, not_identical, wrong_key, after_resume = 0, 0, 0, 0
    offsets: list[list[float]] = []
    for rollout_id, received in by_id.items():
        token = store.hget(Keys(prefix).record("v1", keys[rollout_id]), "admit_token")
        header = {
            {k.lower(): v for k, v in c["headers"].items()}.get("idempotency-key") for c in received
        }
        if header != {token}:
            wrong_key += 1
        if len(received) < 2:
            continue
        repeats += len(received) - 1
        if len({json.dumps(c["body"], sort_keys=True) for c in received}) > 1:
            not_identical += 1
        times = sorted(c["at"] for c in received)
        offsets.append([round(at - faults[0], 3) for at in times])
        if resumed_at is not None:
            after_resume += sum(1 for at in times[1:] if at >= resumed_at)
    return {
        "callbacks": len(calls),
        "lost": len(lost),
        "repeats": repeats,
        "not_identical": not_identical,
        "wrong_key": wrong_key,
        "posted_after_resume": after_resume,
        "offsets_s": offsets,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=["sigstop", "kill9"], required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    # A SIGTERM (a timeout, a supervisor) unwinds like Ctrl-C: every process started stops.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="freeze-") as workdir:
            started = time.monotonic()
            figures = run_once(args.fault, args.seed + run, Path(workdir))
            figures["seconds"] = round(time.monotonic() - started, 1)
            print(json.dumps({"fault": args.fault, "seed": args.seed + run, **figures}), flush=True)


if __name__ == "__main__":
    main()
