"""One nemesis run: start the stage, offer rollouts to both fleets while the schedule's faults
land, then check; the figures go to ``test-output/nemesis/seed-<seed>.json``.

The run is bounded: ``duration + settle`` seconds after the first offer, whatever is still
unfinished (a trainer waiting for a result, a stuck rollout) is a violation of the report,
with every figure and the replay command, never an exception that loses them. A ``plant``
(the checker's own test) runs beside the schedule, to break the promise on purpose."""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_sdk.testing.responders import calculator_responder
from tests.chaos.harness import Protocol
from tests.harness import REPO, v1_body, v2_body
from tests.nemesis.checker import Report, Window, check
from tests.nemesis.faults import GROUPS, SENTINEL_KINDS, Fault, Nemesis, schedule
from tests.nemesis.observe import Holders, PollingTrainer
from tests.nemesis.stage import Stage

FIGURES = REPO / "test-output" / "nemesis"
ROLLOUT_SECONDS = (1.0, 6.0)
WRONG_LABEL_EVERY = 10  # v2 rows with a wrong label: a right run grades them 0


@dataclass(frozen=True)
class Size:
    rollouts: int  # both protocols together
    faults: int
    duration: float  # seconds over which rollouts are offered and faults land
    only: tuple[str, ...] = ()  # fault kinds to draw from (all if empty)
    callback_delay: float = 0.0  # seconds the TrainGate holds each v1 callback (a slow one)
    sentinel: bool = False  # the sentinel stage (primary, replica, three sentinels)
    failovers: int = 0  # the sentinel stage: at least this many failovers in the schedule
    admission_replicas: int = 1  # the sentinel stage: ROLLOUT_FLEET_ADMISSION_REPLICAS
    replica_lag: float = 0.0  # the sentinel stage: replica cut off this long before a kill
    settle: float = 120.0  # seconds past ``duration`` the run waits for every rollout to end


# Breaks the promise on purpose beside the schedule (the checker's own test): run in a thread
# of its own with the stage, the trainers, the nemesis, and an event set once the check is done.
Plant = Callable[[Stage, dict[Protocol, PollingTrainer], Nemesis, threading.Event], None]
# With a callback delay, the schedule has at least this many delivery-window cancels.
DELIVERING_CANCELS = 2

CI_SIZE = Size(rollouts=200, faults=14, duration=45, callback_delay=0.3)
FULL_SIZE = Size(rollouts=1000, faults=36, duration=150)
SENTINEL_CI_SIZE = Size(rollouts=200, faults=16, duration=45, sentinel=True, failovers=3)
SENTINEL_FULL_SIZE = Size(rollouts=600, faults=30, duration=120, sentinel=True, failovers=6)


def bodies(seed: int, protocol: Protocol, count: int, trainer_url: str) -> list[dict[str, Any]]:
    """Rollouts that wait, chat once and wait again: ids ``<protocol>-g<group>-<seed>-<n>``.
    Each asks its own sum (``question``), whose answer that one chat gets; a v2 one is graded
    on it (every ``WRONG_LABEL_EVERY``-th with a wrong label: reward 0)."""
    rng = random.Random(f"{seed}-{protocol}")
    asking = random.Random(f"{seed}-{protocol}-questions")  # the timings stay the seed's
    made = []
    for n in range(count):
        rollout_id = f"{protocol}-g{n % GROUPS}-{seed}-{n}"
        before, after = (rng.uniform(*ROLLOUT_SECONDS) / 2 for _ in range(2))
        messages, answer = question(asking)
        if protocol == "v1":
            steps = [{"sleep": before}, {"chat": {}}, {"sleep": after}, {"complete": {}}]
            made.append(
                v1_body(trainer_url, rollout_id, messages=messages, metadata={"script": steps})
            )
        else:
            steps = [{"sleep": before}, {"chat": {}}, {"sleep": after}]
            label = str(answer + 1 if n % WRONG_LABEL_EVERY == 0 else answer)
            metadata = {"script": steps, "grade": [{"answer": True}]}
            made.append(
                v2_body(
                    trainer_url,
                    rollout_id,
                    initial_messages=messages,
                    label=label,
                    metadata=metadata,
                )
            )
    return made


def question(rng: random.Random) -> tuple[list[dict[str, Any]], int]:
    """A calculator conversation one chat short of its answer: a question, the calculator's
    tool call and the tool's result; the mock TrainGate's calculator answers ``#### <it>``."""
    a, b, sign = rng.randint(2, 99), rng.randint(2, 99), rng.choice("+-*")
    answer = {"+": a + b, "-": a - b, "*": a * b}[sign]
    asked = {"role": "user", "content": f"What is {a} {sign} {b}?"}
    call = calculator_responder([asked]).message()
    result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": str(answer)}
    return [asked, call, result], answer


def replay_command(seed: int, size: Size) -> str:
    only = "".join(f" --only {kind}" for kind in size.only)
    sentinel = (
        f" --sentinel --failovers {size.failovers} --admission-replicas "
        f"{size.admission_replicas} --replica-lag {size.replica_lag:g}"
        if size.sentinel
        else ""
    )
    return (
        f"uv run python -m tests.nemesis --seed {seed} --rollouts {size.rollouts} "
        f"--faults {size.faults} --duration {size.duration:g}{only} "
        f"--callback-delay {size.callback_delay:g} --settle {size.settle:g}{sentinel}"
    )


def run(seed: int, size: Size, workdir: Path | None = None, plant: Plant | None = None) -> Report:
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"nemesis-{seed}-"))
    started = time.monotonic()
    report = Report(replay=replay_command(seed, size))
    stage = Stage(workdir, size.sentinel, size.admission_replicas, size.replica_lag).start()
    report.figures["phases_s"] = {"stage_up": round(time.monotonic() - started, 1)}
    try:
        _exercise(seed, size, stage, report, plant)
    except Exception as exc:  # the figures so far, the violations, the replay: never lost
        report.fail("unfinished", "-", "-", f"the run broke: {type(exc).__name__}: {exc}")
    finally:
        if report.found:
            report.figures["logs"] = stage.logs(1500)[-20000:]
        stage.stop()
    report.figures["phases_s"]["stage_down"] = round(time.monotonic() - started, 1)
    report.figures |= {
        "seed": seed,
        "size": size.__dict__,
        "run_s": round(time.monotonic() - started, 1),
        "violations": report.violations,
        "replay": report.replay,
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    label = getattr(plant, "label", "planted")  # the checker's test: planted or clean
    name = _figures_name(seed, size) if plant is None else f"{label}-{seed}.json"
    (FIGURES / name).write_text(json.dumps(report.figures, indent=1, default=str))
    return report


def _exercise(seed: int, size: Size, stage: Stage, report: Report, plant: Plant | None) -> None:
    """Offer the rollouts while the schedule's faults land, then check; all of it within
    ``duration + settle`` seconds of the first offer (and a repeat's wait)."""
    if size.callback_delay:
        slow = {"target": "completed", "delay_s": size.callback_delay, "times": None}
        stage.trainer.add_faults(slow)
    offered = {p: bodies(seed, p, size.rollouts // 2, stage.trainer.url) for p in ("v1", "v2")}
    pace = size.duration / max(1, size.rollouts // 2)
    holders = Holders(stage).start()
    started = time.monotonic()
    deadline = started + size.duration + size.settle
    trainers: dict[Protocol, PollingTrainer] = {
        p: PollingTrainer(p, stage.fleets[p].gateway_urls, offered[p], pace=pace).start()
        for p in ("v1", "v2")
    }
    by_id = {body["rollout_id"]: body for made in offered.values() for body in made}
    nemesis = Nemesis(stage, _schedule(seed, size), trainers, by_id).start()
    planted = threading.Event()
    if plant is not None:
        thread = threading.Thread(target=plant, args=(stage, trainers, nemesis, planted))
        thread.daemon = True
        thread.start()
    try:
        if not nemesis.join(max(1.0, deadline - time.monotonic())):
            report.fail("unfinished", "-", "-", "the nemesis was still at work at the deadline")
        for protocol, trainer in trainers.items():
            if not trainer.wait(deadline):
                left = trainer.unfinished()
                report.fail(
                    "unfinished",
                    protocol,
                    "-",
                    f"the trainer still waited after {time.monotonic() - started:.0f}s, "
                    f"for {len(left)} results: {left[:5]}",
                )
            trainer.stop()
        report.figures["phases_s"]["offered"] = round(time.monotonic() - started, 1)  # from load
        window = Window(size.callback_delay, size.replica_lag)
        check(stage, nemesis, trainers, holders, deadline, window, report)
        report.figures["phases_s"]["checked"] = round(time.monotonic() - started, 1)  # from load
    finally:
        planted.set()
        holders.stop()


def _schedule(seed: int, size: Size) -> list[Fault]:
    at_least = {"cancel_delivering": DELIVERING_CANCELS} if size.callback_delay else {}
    if not size.sentinel:
        return schedule(seed, size.faults, size.duration, size.only, at_least=at_least)
    at_least |= {"failover": size.failovers}
    return schedule(seed, size.faults, size.duration, size.only, SENTINEL_KINDS, at_least)


def _figures_name(seed: int, size: Size) -> str:
    parts = [f"seed-{seed}", *size.only]
    if size.sentinel:
        parts += [f"sentinel-wait{size.admission_replicas}"]
        parts += [f"lag{size.replica_lag:g}"] if size.replica_lag else []
    return "-".join(parts) + ".json"


__all__ = [
    "CI_SIZE",
    "DELIVERING_CANCELS",
    "FULL_SIZE",
    "SENTINEL_CI_SIZE",
    "SENTINEL_FULL_SIZE",
    "WRONG_LABEL_EVERY",
    "Plant",
    "Size",
    "bodies",
    "question",
    "replay_command",
    "run",
]
