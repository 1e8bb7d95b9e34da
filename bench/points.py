"""The benchmark points: each runs the fleet and the in-process baseline on one workload and
returns JSON-ready lines — one per system, then one per target comparing them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from bench import sandboxes as sb
from bench.cli_start import cli_start
from bench.drivers import Run, drive_admissions, drive_long_polls, drive_v1, drive_v2
from bench.measure import RedisTraffic, Usage, idle_commands
from bench.systems import System, baseline, fleet, replica, traingate
from bench.upstream import HARBOR, UpstreamUnavailable, upstream_baseline
from bench.upstream import NAME as UPSTREAM
from bench.workloads import REPO, v1_bodies, v2_bodies

CALCULATOR = str(REPO / "examples/calculator/server.py:agent_loop")
STRANDS = str(REPO / "examples/strands_multiply/main.py")
OPENAI_AGENTS = str(REPO / "examples/openai_agents_multiply/main.py")
STRANDS_OSMOSIS = str(REPO / "bench/agents/strands_osmosis.py")
NOOP = str(REPO / "bench/agents/noop.py")
BUSY = str(REPO / "bench/agents/busy.py")
SLEEPY = str(REPO / "bench/agents/sleepy.py")
WARMUP = 16
# The in-process v1 server turns rollouts away past its limit (100 by default).
UNCAPPED_BASELINE = {"OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS": "5000"}

ROOMY = {"ROLLOUT_FLEET_MAX_QUEUED": "100000"}  # admissions never answer 429
Line = dict[str, Any]
Point = Callable[[float], Coroutine[Any, Any, list[Line]]]
Drive = Callable[[System, int, str], Awaitable[Run]]  # (system, count, label) → run


def system_line(system: System, run: Run, usage: Usage) -> Line:
    figures = run.figures()
    done = max(1, figures["completed"])
    cpu = {role: round(seconds * 1000 / done, 2) for role, seconds in usage.cpu.items()}
    server = sum(ms for role, ms in cpu.items() if role != "redis")
    return {
        "system": system.name,
        **figures,
        "cpu_ms_per_rollout": cpu,
        "server_cpu_ms_per_rollout": round(server, 2),
        "driver_cpu_ms_per_rollout": round(usage.driver_cpu * 1000 / done, 2),
        "machine_cpu_ms_per_rollout": round(usage.machine_busy * 1000 / done, 2),
        "machine_busy_pct": round(100 * usage.machine_busy / max(usage.machine_capacity, 1e-9)),
        "peak_rss_mb": {role: round(mb) for role, mb in usage.peak_rss_mb.items()},
    }


def verdict(figure: str, value: float, target: str, met: bool) -> Line:
    return {"figure": figure, "value": round(value, 2), "target": target, "met": met}


def bound(figure: str, value: float, op: str, limit: float) -> Line:
    """A target ``value <op> limit`` (``<=`` or ``>=``): met or not, and the gap (how far
    past the limit the value is; negative when short of a ``>=`` target)."""
    met = value <= limit if op == "<=" else value >= limit
    line = verdict(figure, value, f"{op} {limit:g}", met)
    line["gap"] = round(value - limit, 2)
    return line


def reported(figure: str, value: float) -> Line:
    """A figure reported for reading, with no target."""
    return verdict(figure, value, "report", True)


def redis_targets(ours: Line) -> list[Line]:
    """Redis's share of a fleet run: commands per rollout (target), its CPU (reported)."""
    return [
        bound("Redis commands/rollout", float(ours["redis_commands_per_rollout"]), "<=", 30),
        reported("Redis CPU ms/rollout", float(ours["cpu_ms_per_rollout"]["redis"])),
    ]


async def measure(system: System, drive: Drive, count: int) -> Line:
    await drive(system, WARMUP, "warmup")
    async with RedisTraffic(system.redis_url) as traffic:
        with Usage(system.roles) as usage:
            run = await drive(system, count, "run")
    line = system_line(system, run, usage)
    if system.redis_url is not None:
        line.update(traffic.per_rollout(max(1, int(line["completed"]))))
        line["redis_idle_commands_per_s_per_worker"] = await idle_commands(system)
    return line


def v1_drive(trainer: str, concurrency: int) -> Drive:
    def drive(system: System, count: int, label: str) -> Awaitable[Run]:
        return drive_v1(system.url, trainer, v1_bodies(trainer, count, label), concurrency)

    return drive


def v2_drive(trainer: str, concurrency: int, history: int = 0) -> Drive:
    def drive(system: System, count: int, label: str) -> Awaitable[Run]:
        return drive_v2(system.url, v2_bodies(trainer, count, label, history), concurrency)

    return drive


async def fleet_and_baseline(
    agent: str,
    protocol: str,
    drive: Drive,
    count: int,
    workers: int = 2,
    concurrency: int = 256,
    env: dict[str, str] | None = None,
) -> tuple[Line, Line]:
    with fleet(agent, workers, concurrency, env) as ours:
        measured = await measure(ours, drive, count)
    with baseline(agent, protocol, {**UNCAPPED_BASELINE, **(env or {})}) as theirs:
        reference = await measure(theirs, drive, count)
    return measured, reference


def ratio(ours: Line, reference: Line) -> float:
    return float(ours["rollouts_per_s"]) / max(0.01, float(reference["rollouts_per_s"]))


async def dispatch(scale: float) -> list[Line]:
    """A no-op v2 agent: what remains is the fleet's own cost per rollout."""
    count = int(2000 * scale)
    with traingate(0.0) as trainer:
        drive = v2_drive(trainer, 64)
        ours, reference = await fleet_and_baseline(NOOP, "v2", drive, count)
        with fleet(NOOP, 2, 256, {"ROLLOUT_FLEET_TASK_EVENTS": "false"}) as quiet:
            lean = await measure(quiet, drive, count)
    lean["system"] = f"{lean['system']} no task events"
    cpu, lean_cpu = (float(line["server_cpu_ms_per_rollout"]) for line in (ours, lean))
    return [
        ours,
        lean,
        reference,
        bound("fleet CPU ms/rollout", cpu, "<=", 2.0),
        bound("fleet CPU ms/rollout, no task events", lean_cpu, "<=", 1.5),
        reported("fleet CPU / baseline CPU", cpu / float(reference["server_cpu_ms_per_rollout"])),
        *redis_targets(ours),
        reported("Redis commands/s idle, per worker", ours["redis_idle_commands_per_s_per_worker"]),
    ]


async def calculator_v1(scale: float) -> list[Line]:
    """The v1 calculator (2 LLM calls), TrainGate latency 100 ms, C = 256."""
    with traingate(0.1) as trainer:
        ours, reference = await fleet_and_baseline(
            CALCULATOR, "v1", v1_drive(trainer, 256), int(3000 * scale)
        )
    rate, times = float(ours["rollouts_per_s"]), ratio(ours, reference)
    return [
        ours,
        reference,
        bound("fleet rollouts/s", rate, ">=", 190),
        reported("fleet / in-process baseline", times),
        *redis_targets(ours),
    ]


def framework(agent: str) -> Point:
    async def point(scale: float) -> list[Line]:
        """A bundled framework example (2 LLM turns, streamed), latency 100 ms, C = 256."""
        with traingate(0.1) as trainer:
            ours, reference = await fleet_and_baseline(
                agent, "v2", v2_drive(trainer, 256), int(1000 * scale)
            )
        times = ratio(ours, reference)
        overhead = float(ours["server_cpu_ms_per_rollout"]) - float(
            reference["server_cpu_ms_per_rollout"]
        )
        return [
            ours,
            reference,
            reported("fleet / in-process baseline", times),
            bound("fleet CPU ms/rollout over baseline", overhead, "<=", 2.0),
            *redis_targets(ours),
        ]

    return point


async def upstream(scale: float) -> list[Line]:
    """What users run today: upstream osmosis-ai 0.3.8's single-process server (its own
    Python 3.12 virtualenv) against the fleet with two workers, on one Strands workflow
    written against ``osmosis_ai`` (native there, our alias here), 100 ms, C = 256."""
    count = int(1000 * scale)
    with traingate(0.1) as trainer:
        drive_with = v2_drive(trainer, 256)
        with fleet(STRANDS_OSMOSIS, 2, 256) as ours:
            measured = await measure(ours, drive_with, count)
        with upstream_baseline(STRANDS_OSMOSIS) as theirs:
            reference = await measure(theirs, drive_with, count)
    times = ratio(measured, reference)
    return [measured, reference, bound("fleet / upstream osmosis-ai", times, ">=", 2.8)]


SANDBOX_SLOTS = 4  # TrialQueue(n_concurrent=...) in every process, fleet worker or upstream


async def sandboxes(scale: float) -> list[Line]:
    """Sandboxed rollouts: each a Harbor trial of the oracle agent in a container of its own,
    on one task and one Docker engine. The fleet (Redis, a gateway, 1 and 2 workers) runs our
    HarborBackend; upstream osmosis-ai 0.3.8 its own, served by its own create_rollout_server
    (its venv: bench/upstream.py HARBOR). Both load the same main.py: TrialQueue(n_concurrent=4)
    per process, cleanup_successful_trials=True. v2; all rollouts offered at once, after a
    warm-up of one per sandbox slot (the task's image is built before: the fleet's workers and
    upstream's server prewarm when they start)."""
    count = max(2, int(24 * scale))
    lines: list[Line] = []
    with tempfile.TemporaryDirectory(prefix="bench-sandboxes-") as scratch:
        main = str(sb.write_oracle_rollout(Path(scratch) / "rollout", slots=SANDBOX_SLOTS))
        try:
            docker = sb.docker_env(Path(scratch) / "docker-config")
        except sb.SandboxesUnavailable as exc:  # the other points still run
            return [{"system": "fleet", "blocker": str(exc)}]
        with traingate(0.0) as trainer:
            for workers in (1, 2):
                with fleet(main, workers, SANDBOX_SLOTS, docker) as ours:
                    lines.append(
                        await _trials(ours, trainer, count, workers * SANDBOX_SLOTS, docker)
                    )
            lines.append(await _upstream_trials(main, trainer, count, docker))
    fleet_1w, fleet_2w, theirs = lines
    figures = [
        reported("fleet-2w / fleet-1w trials/s", _trial_ratio(fleet_2w, fleet_1w)),
    ]
    if "trials_per_s" in theirs:
        figures += [
            reported("fleet-1w / upstream trials/s", _trial_ratio(fleet_1w, theirs)),
            reported("fleet-2w / upstream trials/s", _trial_ratio(fleet_2w, theirs)),
        ]
    return [*lines, *figures]


def _trial_ratio(ours: Line, reference: Line) -> float:
    return float(ours["trials_per_s"]) / max(1e-9, float(reference["trials_per_s"]))


async def _trials(
    system: System,
    trainer: str,
    count: int,
    slots: int,
    docker: dict[str, str],
    timings: Callable[[dict[str, Any]], list[dict[str, float]]] = sb.fleet_timings,
    timings_from: str = "the v2 result's sample metrics",
) -> Line:
    """One system's figures: a warm-up of one rollout per slot, then ``count`` offered at
    once, each polled to its end; trials per second over the wall clock, the trials' phase
    timings (``timings`` reads them from the results), CPU with the commands each server ran
    (the docker CLI and Compose), the fleet's Redis traffic, and the load the machine was
    under."""
    await drive_v2(system.url, v2_bodies(trainer, slots, "warmup"), slots)
    results: dict[str, Any] = {}
    bodies = v2_bodies(trainer, count, "trial")
    load, others = os.getloadavg(), sb.containers(docker)
    async with RedisTraffic(system.redis_url) as traffic:
        with Usage(system.roles, reaped=True) as usage:
            run = await drive_v2(system.url, bodies, count, results=results)
    line = system_line(system, run, usage)
    line.update(traffic.per_rollout(max(1, int(line["completed"]))))
    line["slots"] = slots
    line["wall_s"] = round(run.wall_seconds, 2)
    line["trials_per_s"] = round(int(line["completed"]) / run.wall_seconds, 3)
    line["load_avg_1_5_15"] = {
        "before": [round(x, 2) for x in load],
        "after": [round(x, 2) for x in os.getloadavg()],
    }
    line["engine_containers_at_start"] = others
    samples = [r.get("sample") or {} for r in results.values()]
    line["rewards"] = sorted({s.get("reward") for s in samples}, key=str)
    line["result_metrics"] = sorted({k for s in samples for k in s.get("metrics") or {}})
    line["timings_from"] = timings_from
    line.update(sb.phase_figures(timings(results), run.wall_seconds, slots, count))
    return line


async def _upstream_trials(main: str, trainer: str, count: int, docker: dict[str, str]) -> Line:
    """Upstream's server on the same folder and engine; a line saying why not when its venv
    cannot be built or its server does not start here."""
    with contextlib.ExitStack() as stack:
        try:
            theirs = stack.enter_context(upstream_baseline(main, docker, HARBOR, 600))
        except (
            UpstreamUnavailable,
            subprocess.CalledProcessError,
            RuntimeError,
            TimeoutError,
        ) as exc:
            said = [line for line in str(exc).splitlines() if line.strip()] or [repr(exc)]
            reason = said[0] if len(said) == 1 else f"{said[0]} ... {said[-1]}"
            return {"system": UPSTREAM, "blocker": reason}
        artifacts = theirs.artifacts
        assert artifacts is not None

        def timings(results: dict[str, Any]) -> list[dict[str, float]]:
            return sb.upstream_timings(artifacts, list(results))

        source = "diagnostics.json beside each rollout's artifacts (timings_sec)"
        return await _trials(theirs, trainer, count, SANDBOX_SLOTS, docker, timings, source)


async def peak_running(redis_url: str, leases_key: str, done: asyncio.Event) -> int:
    """The most rollouts the fleet held leases on at once (sampled every 0.1 s)."""
    redis = Redis.from_url(redis_url)
    peak = 0
    try:
        while not done.is_set():
            peak = max(peak, await redis.zcard(leases_key))
            await asyncio.sleep(0.1)
    finally:
        await redis.aclose()
    return peak


async def capacity(scale: float) -> list[Line]:
    """One worker process with 1000 slots running v1 calculator rollouts (C = 1000): at the
    target's TrainGate latency of 2 s, and at a latency long enough that the worker's start
    rate fills every slot (the first shows throughput, the second memory at 1000 held)."""
    count = int(3000 * scale)
    lines: list[Line] = []
    for latency in (2.0, 8.0):
        done = asyncio.Event()
        with traingate(latency) as trainer, fleet(CALCULATOR, 1, 1000) as ours:
            assert ours.redis_url is not None
            assert ours.leases_key is not None
            sampler = asyncio.create_task(peak_running(ours.redis_url, ours.leases_key, done))
            line = await measure(ours, v1_drive(trainer, 1000), count)
            done.set()
            line["peak_running"] = await sampler
        line["system"] = f"{line['system']} latency {latency:g}s"
        lines.append(line)
    held = max(int(line["peak_running"]) for line in lines)
    rss = max(float(line["peak_rss_mb"]["workers"]) for line in lines)
    errors = sum(sum(line["errors"].values()) for line in lines)
    complete = all(line["completed"] == count for line in lines)
    return [
        *lines,
        verdict("rollouts running at once", held, ">= 1000", held >= 1000),
        verdict("worker peak RSS MB", rss, "<= 400", rss <= 400),
        verdict("errors", errors, "== 0", errors == 0 and complete),
    ]


async def long_polls(scale: float) -> list[Line]:
    """5000 result long-polls open at once on one gateway process."""
    count = int(5000 * scale)
    lines: list[Line] = []
    env = {"ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "10"}
    with traingate(0.0) as trainer, fleet(SLEEPY, 1, 10, env) as ours:
        admitted = await drive_admissions(ours.url, v2_bodies(trainer, count, "lp"), 64)
        with Usage(ours.roles, connections_of="gateway") as usage:
            run = await drive_long_polls(ours.url, admitted.tokens)
        lines.append(system_line(ours, run, usage))
    errors = sum(run.errors.values()) + sum(admitted.errors.values())
    held = usage.peak_connections
    lines[0]["peak_open_connections"] = held
    return [
        *lines,
        verdict("long-polls open at once", held, ">= 5000", held >= count),
        verdict("long-poll errors", errors, "== 0", errors == 0 and len(run.latencies) == count),
    ]


async def admission(scale: float) -> list[Line]:
    """One gateway process admitting v2 rollouts: flat out (C = 64), then paced at 500/s."""
    lines: list[Line] = []
    roomy = {"ROLLOUT_FLEET_MAX_QUEUED": "100000"}
    with traingate(0.0) as trainer, fleet(SLEEPY, 1, 10, roomy) as ours:
        for rate, count in ((None, int(6000 * scale)), (500.0, int(3000 * scale))):
            await drive_admissions(ours.url, v2_bodies(trainer, WARMUP, "warm"), 16)
            bodies = v2_bodies(trainer, count, "adm")
            with Usage(ours.roles) as usage:
                run = await drive_admissions(ours.url, bodies, 64 if rate is None else 256, rate)
            line = system_line(ours, run, usage)
            line["system"] = f"{ours.name} admit {'flat out' if rate is None else f'at {rate:g}/s'}"
            lines.append(line)
    flat, paced = float(lines[0]["rollouts_per_s"]), float(lines[1]["p99_ms"] or 0)
    lines.append(verdict("admissions/s", flat, ">= 1500", flat >= 1500))
    lines.append(verdict("p99 ms at 500/s", paced, "<= 20", paced <= 20))
    return lines


async def scaling(scale: float) -> list[Line]:
    """A CPU-bound agent (20 ms per rollout) on 1 and on 2 worker processes."""
    count = int(600 * scale)
    lines = []
    with traingate(0.0) as trainer:
        for workers in (1, 2):
            with fleet(BUSY, workers, 64) as ours:
                lines.append(await measure(ours, v2_drive(trainer, 64), count))
    factor = ratio(lines[1], lines[0])
    return [*lines, verdict("2 workers / 1 worker", factor, "near 2", factor >= 1.6)]


async def growth(scale: float) -> list[Line]:
    """How the no-op rollout's cost grows with C (in flight) and with history length
    (earlier messages carried in and out), fleet and baseline side by side."""
    count = int(1000 * scale)
    lines: list[Line] = []
    quiet = {"ROLLOUT_FLEET_TASK_EVENTS": "false"}
    sweeps = [(c, 0) for c in (16, 64, 256)] + [(64, h) for h in (50, 200)]
    with traingate(0.0) as trainer:
        for concurrency, history in sweeps:
            drive = v2_drive(trainer, concurrency, history)
            pair = await fleet_and_baseline(NOOP, "v2", drive, count, env=quiet)
            for line in pair:
                line["system"] = f"{line['system']} C={concurrency} history={history}"
            lines.extend(pair)
    return lines


async def replication(scale: float) -> list[Line]:
    """What ROLLOUT_FLEET_ADMISSION_REPLICAS=1 (Redis WAIT on every admission) costs: one
    gateway admitting v2 rollouts flat out (C = 64), with a synced replica, without and with
    the wait; then what it saves: acknowledged admissions lost when the primary dies while
    its replica lags a second behind."""
    lines: list[Line] = []
    count = int(3000 * scale)
    with traingate(0.0) as trainer:
        for replicas in (0, 1):
            env = {
                "ROLLOUT_FLEET_MAX_QUEUED": "100000",
                "ROLLOUT_FLEET_ADMISSION_REPLICAS": f"{replicas}",
            }
            with fleet(SLEEPY, 1, 10, env) as ours, replica(ours):
                await drive_admissions(ours.url, v2_bodies(trainer, WARMUP, "warm"), 16)
                with Usage(ours.roles) as usage:
                    run = await drive_admissions(ours.url, v2_bodies(trainer, count, "rep"), 64)
                line = system_line(ours, run, usage)
                line["system"] = f"{ours.name} admit, WAIT {replicas} replica(s)"
                lines.append(line)
        lines += [await _failover_loss(trainer, replicas) for replicas in (0, 1)]
    cost = ratio(lines[1], lines[0])
    lines.append(verdict("admissions/s with WAIT 1 / without", cost, "report", True))
    lost = int(lines[3]["acknowledged_lost"])
    lines.append(verdict("acknowledged admissions lost, WAIT 1", lost, "== 0", lost == 0))
    return lines


async def _failover_loss(trainer: str, replicas: int) -> Line:
    """Admissions at 200/s for 4 s; at 2 s the replica falls behind (its link is cut: it
    stops replicating), at 2.8 s the primary dies (SIGKILL) and the replica takes over: how
    many admissions answered 202 are missing from it. (A frozen replica would not do: the
    kernel keeps receiving for it, and it catches up when it wakes.)"""
    env = {"ROLLOUT_FLEET_ADMISSION_REPLICAS": f"{replicas}"}
    with fleet(SLEEPY, 1, 10, env) as ours, replica(ours) as successor:
        primary_pid = ours.roles["redis"][0]
        client = Redis(port=successor.port, decode_responses=True)

        async def faults() -> None:
            await asyncio.sleep(2.0)
            await client.replicaof("NO", "ONE")
            await asyncio.sleep(0.8)
            os.kill(primary_pid, signal.SIGKILL)

        bodies = v2_bodies(trainer, 800, f"failover{replicas}")
        chaos = asyncio.create_task(faults())
        run = await drive_admissions(ours.url, bodies, 64, 200.0)
        await chaos
        try:
            prefix = f"{ours.leases_key.split(':')[0]}:v2:" if ours.leases_key else "rf:v2:"
            present = [bool(await client.exists(prefix + i)) for i in run.tokens]
        finally:
            await client.aclose()
    return {
        "system": f"failover, WAIT {replicas} replica(s)",
        "acknowledged": len(run.tokens),
        "acknowledged_lost": present.count(False),
        "refused": sum(run.errors.values()),
    }


POINTS: dict[str, Point] = {
    "dispatch": dispatch,
    "calculator-v1": calculator_v1,
    "strands": framework(STRANDS),
    "openai-agents": framework(OPENAI_AGENTS),
    "upstream": upstream,
    "sandboxes": sandboxes,
    "capacity": capacity,
    "long-polls": long_polls,
    "admission": admission,
    "scaling": scaling,
    "growth": growth,
    "replication": replication,
    "cli-start": cli_start,
}
