"""Chaos: the TrainGate misbehaves. 10 % of LLM calls answer 503, 5 % hang past the client's
timeout, 5 % cut the connection mid-answer, 20 % are slow; one v1 completion callback fails
twice and then succeeds, another never succeeds. Every rollout still ends exactly once, and
the undeliverable one ends with its failure recorded, nothing retrying it forever."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from tests.chaos.conftest import StartChaos
from tests.chaos.harness import Protocol, Trainer, audit, chaos_bodies, record_figures
from tests.harness import REPO, new_id, v2_body

ROLLOUTS = 200
LLM_FAULTS = [
    {"target": "chat", "status": 503, "times": None, "probability": 0.10},
    {"target": "chat", "delay_s": 3.0, "times": None, "probability": 0.05},  # client timeout: 2 s
    {"target": "chat", "reset": True, "times": None, "probability": 0.05},
    {"target": "chat", "delay_s": 0.5, "times": None, "probability": 0.20},
]
MULTIPLY = REPO / "examples/openai_agents_multiply"


def multiply_bodies(trainer_url: str, count: int) -> list[dict[str, Any]]:
    """v2 rollouts of the OpenAI Agents example (a real framework, with its own retries)."""
    rows = [json.loads(line) for line in (MULTIPLY / "test_data.jsonl").read_text().splitlines()]
    bodies = []
    for index in range(count):
        row, rollout_id = rows[index % len(rows)], new_id("llm-faults")
        messages = [
            {"role": "system", "content": row["system_prompt"]},
            {"role": "user", "content": row["user_prompt"]},
        ]
        bodies.append(
            v2_body(trainer_url, rollout_id, initial_messages=messages, label=row["ground_truth"])
        )
    return bodies


def test_a_faulty_traingate_never_loses_or_doubles_a_rollout(
    start_chaos: StartChaos, protocol: Protocol
) -> None:
    if protocol == "v1":
        chaos = start_chaos(concurrency=30)
        bodies = chaos_bodies("v1", chaos.trainer.url, ROLLOUTS, seconds=(0.2, 1))
    else:
        chaos = start_chaos(str(MULTIPLY / "main.py"), concurrency=30)
        bodies = multiply_bodies(chaos.trainer.url, ROLLOUTS)
    chaos.trainer.add_faults(*LLM_FAULTS)
    flaky, dead = bodies[0]["rollout_id"], bodies[1]["rollout_id"]
    if chaos.protocol == "v1":
        chaos.trainer.add_faults(
            {"target": "completed", "status": 503, "times": 2, "rollout_id": flaky},
            {"target": "completed", "status": 503, "times": None, "rollout_id": dead},
        )
    trainer = Trainer(chaos.protocol, chaos.fleet.gateway_urls, bodies).start()
    undeliverable = {dead} if chaos.protocol == "v1" else set()
    outcome = audit(chaos, trainer, timeout=180, undeliverable=undeliverable)

    extra: dict[str, Any] = {"llm_calls": len(chaos.trainer.calls("chat"))}
    if chaos.protocol == "v1":
        assert len(chaos.trainer.calls("completed", flaky)) == 3  # failed twice, then delivered
        record = chaos.redis().hgetall(chaos.record_key(dead))
        assert record["delivery"].startswith("failed: ")
        time.sleep(3)
        assert len(chaos.trainer.calls("completed", dead)) == 3  # 1 + 2 retries, then no more
        extra["callback_never_accepted"] = record["delivery"]
    else:
        failures = [r for r in trainer.results.values() if r["status"] != "success"]
        assert all(r["err_category"] and r["err_message"] for r in failures)
        extra["failures"] = dict(
            Counter(f"{r['err_category']}: {r['err_message'][:80]}" for r in failures)
        )
    record_figures("traingate-faults", chaos.protocol, outcome, **extra)
