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

    uv run python -m tests.reliability.scenario_freeze --fault sigstop --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from tests.chaos.harness import Trainer
from tests.harness import CALCULATOR_AGENT, calculator_bodies, start_mock_trainer

TERMINAL = {"success", "failure", "cancelled"}


def _holdings(fleet: LocalFleet, store: Any) -> dict[str, int]:
    counts = dict.fromkeys((n for n in fleet.processes if n.startswith("worker")), 0)
    for record in store.zrange(f"{fleet.key_prefix}:leases", 0, -1):
        execution = store.hget(record, "execution") or ""
        for name in counts:
            if f":{fleet.processes[name].pid}:" in execution:
                counts[name] += 1
    return counts


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
        time.sleep(rng.uniform(0.8, 1.6))
        holdings = _holdings(fleet, store)
        victim = max(holdings, key=lambda name: holdings[name])
        if fault == "sigstop":
            pid = fleet.processes[victim].pid
            faults.append(time.time())
            os.kill(pid, signal.SIGSTOP)
            time.sleep(30)
            os.kill(pid, signal.SIGCONT)
        else:
            for _ in range(2):
                faults.append(time.time())
                fleet.processes[victim].kill()
                fleet.restart_dead_workers()
                time.sleep(rng.uniform(1.0, 3.0))
        offered.join(120)
        keys = {body["rollout_id"]: body["rollout_id"] for body in bodies}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            statuses = [store.hget(f"{fleet.key_prefix}:v1:{k}", "status") for k in keys]
            if all(s in TERMINAL for s in statuses):
                break
            time.sleep(0.5)
        time.sleep(3)  # a last repeat, if any, lands
        return _judge(trainer.calls("completed"), store, fleet.key_prefix, keys, faults)
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
) -> dict[str, Any]:
    by_id: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        by_id.setdefault(call["rollout_id"], []).append(call)
    lost = [rollout_id for rollout_id in keys if rollout_id not in by_id]
    repeats, not_identical, wrong_key, gaps, outside = 0, 0, 0, [], 0
    for rollout_id, received in by_id.items():
        token = store.hget(f"{prefix}:v1:{keys[rollout_id]}", "admit_token")
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
        first = min(c["at"] for c in received)
        after = [at - first for at in faults if at >= first]
        if after:
            gaps.append(min(after))
        else:
            outside += 1
    return {
        "callbacks": len(calls),
        "lost": len(lost),
        "repeats": repeats,
        "not_identical": not_identical,
        "wrong_key": wrong_key,
        "outside_window": outside,
        "fault_after_first_callback_ms": (
            {
                "median": round(statistics.median(gaps) * 1000, 1),
                "max": round(max(gaps) * 1000, 1),
            }
            if gaps
            else None
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=["sigstop", "kill9"], required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="freeze-") as workdir:
            started = time.monotonic()
            figures = run_once(args.fault, args.seed + run, Path(workdir))
            figures["seconds"] = round(time.monotonic() - started, 1)
            print(json.dumps({"fault": args.fault, "seed": args.seed + run, **figures}), flush=True)


if __name__ == "__main__":
    main()
