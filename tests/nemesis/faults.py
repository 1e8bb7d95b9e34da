"""The fault schedule: drawn from a seed, applied while rollouts run.

Each kind is something the fleet must survive without breaking the promise. ``CRASHES`` are
the kinds that may repeat a v1 callback: a worker that dies (or stops past its lease, or
whose Redis dies) between the POST and the write that records it.

The sentinel stage adds ``failover``: the primary the sentinels name is killed (``kill -9``),
the other server takes over, the killed one comes back as its replica, ready for the next
failover. It counts as a crash: the workers' Redis dies, and what the replica had not yet
received when it died (a few milliseconds of writes, more if ``--replica-lag`` cut it off)
is gone with it; only admissions wait for the replica. There ``redis_restart`` restarts the
replica (the primary's death being the failover): no fleet process talks to it, so it is no
crash; with ``ROLLOUT_FLEET_ADMISSION_REPLICAS=1`` admissions answer 503 until it is back.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from celery import Celery

from rollout_fleet.local import fleet_command
from tests.chaos.harness import Protocol, Trainer
from tests.nemesis.stage import PREFIX, WORKERS, Stage

# kind → weight. Every kind appears once in a schedule; the rest are drawn by weight.
KINDS = {
    "kill9": 4,
    "sigstop": 3,
    "sigterm": 2,
    "client_kill": 2,
    "redis_restart": 1,
    "gateway_kill": 2,
    "cancel_id": 3,
    "cancel_prefix": 2,
    "cancel_all": 1,
    "cancel_delivering": 2,
    "revoke": 2,
    "readmit": 2,
}
# The sentinel stage's kinds: the same, and failovers.
SENTINEL_KINDS = {**KINDS, "failover": 3}
CRASHES = {"kill9", "sigstop", "sigterm", "redis_restart", "failover"}
GROUPS = 10  # rollout ids are <protocol>-g<group>-<n>: what a prefix cancel selects
LEASE = 3.0  # STAGE_ENV's lease


@dataclass
class Fault:
    at: float  # seconds into the run
    kind: str
    protocol: Protocol
    index: int  # which worker / gateway (1-based)
    pick: float  # a draw in [0, 1) to pick a rollout, a group, a duration

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def schedule(
    seed: int,
    count: int,
    duration: float,
    only: Sequence[str] = (),
    kinds_weights: Mapping[str, int] = KINDS,
    at_least: Mapping[str, int] | None = None,
) -> list[Fault]:
    """``count`` faults over ``duration`` seconds: every kind (of ``only``, if given) once, or
    ``at_least`` times, the rest drawn by weight. (Without ``at_least``, a seed draws what it
    always drew.)"""
    rng = random.Random(seed)
    pool = {kind: weight for kind, weight in kinds_weights.items() if not only or kind in only}
    kinds = [kind for kind in pool for _ in range(max(1, (at_least or {}).get(kind, 1)))]
    while len(kinds) < count:
        kinds += rng.choices(list(pool), weights=list(pool.values()))
    kinds = kinds[:count]
    rng.shuffle(kinds)
    faults = [
        Fault(
            at=round(rng.uniform(1.0, duration), 2),
            kind=kind,
            protocol=rng.choice(("v1", "v2")),
            index=rng.randint(1, WORKERS),
            pick=rng.random(),
        )
        for kind in kinds
    ]
    return sorted(faults, key=lambda fault: fault.at)


@dataclass
class Nemesis:
    """Applies faults at their times (from its own thread) and remembers what it did."""

    stage: Stage
    faults: list[Fault]
    trainers: dict[Protocol, Trainer]  # their ``admitted`` grows as they go
    bodies: dict[str, dict[str, Any]]  # by rollout id, to re-admit
    log: list[dict[str, Any]] = field(default_factory=list)
    crashes: list[tuple[float, str]] = field(default_factory=list)  # (epoch time, kind)
    cancelled: dict[str, list[str]] = field(default_factory=dict)  # rollout id → how
    cancelled_groups: list[str] = field(default_factory=list)  # v2 id prefixes cancelled
    cancel_all_at: list[float] = field(default_factory=list)  # epoch times of v2 cancel-all
    readmitted: dict[str, int] = field(default_factory=dict)  # rollout id → status answered
    errors: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self) -> Nemesis:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the nemesis is still at work"

    def _run(self) -> None:
        started = time.monotonic()
        for fault in self.faults:
            time.sleep(max(0.0, fault.at - (time.monotonic() - started)))
            try:
                done = getattr(self, f"_{fault.kind}")(fault)
            except Exception as exc:  # a fault that could not be applied is reported
                self.errors.append(f"{fault.kind}@{fault.at}: {type(exc).__name__}: {exc}")
                done = "error"
            self.log.append({**fault.describe(), "done": done, "epoch": time.time()})

    # --- processes ---------------------------------------------------------------------

    def _worker(self, fault: Fault) -> tuple[str, Any]:
        fleet = self.stage.fleets[fault.protocol]
        name = f"worker-{fault.index}"
        return name, fleet.processes[name]

    def _crash(self, kind: str) -> None:
        self.crashes.append((time.time(), kind))

    def _kill9(self, fault: Fault) -> str:
        name, process = self._worker(fault)
        self._crash("kill9")
        process.kill()
        time.sleep(0.5 + 1.5 * fault.pick)  # the supervisor's restart delay
        self.stage.fleets[fault.protocol].restart_dead_workers()
        return name

    def _sigstop(self, fault: Fault) -> str:
        name, process = self._worker(fault)
        self._crash("sigstop")
        process.signal(signal.SIGSTOP)
        time.sleep(LEASE + 1 + 2 * fault.pick)  # past its lease: its rollouts go elsewhere
        process.signal(signal.SIGCONT)
        return name

    def _sigterm(self, fault: Fault) -> str:
        name, process = self._worker(fault)
        self._crash("sigterm")
        process.stop()  # SIGTERM, its grace, then gone
        self.stage.fleets[fault.protocol].restart_dead_workers()
        return name

    def _client_kill(self, fault: Fault) -> str:
        client = self.stage.redis()
        try:
            return str(client.client_kill_filter(_type="normal", skipme=True))
        finally:
            client.close()

    def _redis_restart(self, fault: Fault) -> str:
        if self.stage.sentinels is not None:  # the replica's: no fleet process uses it
            self._crash("replica_restart")
            self.stage.restart_redis()
            return "replica restarted"
        self._crash("redis_restart")
        self.stage.restart_redis()
        return "restarted"

    def _failover(self, fault: Fault) -> str:
        if self.stage.sentinels is None:
            raise RuntimeError("a failover needs the sentinel stage (--sentinel)")
        figures = self.stage.failover(lambda: self._crash("failover"))
        return json.dumps(figures)

    def _gateway_kill(self, fault: Fault) -> str:
        fleet = self.stage.fleets[fault.protocol]
        index = 1 + fault.index % 2
        name = "gateway" if index == 1 else f"gateway-{index}"
        fleet.processes[name].kill()
        time.sleep(0.5 + fault.pick)
        fleet.processes.pop(name).stop()
        fleet.start_gateway(index=index)
        return name

    # --- trainers' and operators' actions ----------------------------------------------

    def _pick(self, protocol: Protocol, pick: float) -> str | None:
        while True:
            try:
                ids = sorted(self.trainers[protocol].admitted)  # another thread adds to it
                break
            except RuntimeError:
                continue
        return ids[int(pick * len(ids))] if ids else None

    def _cancel(self, protocol: Protocol, rollout_ids: list[str], how: str) -> str:
        for rollout_id in rollout_ids:
            self.cancelled.setdefault(rollout_id, []).append(how)
        if protocol == "v2":
            selector = {"ids": rollout_ids}
            return self._v2_cancel(selector)
        env = self.stage.fleets["v1"].process_env()
        argv = fleet_command("cancel", *rollout_ids)
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        return run.stdout.strip()[-200:]

    def _v2_cancel(self, selector: dict[str, Any]) -> str:
        url = f"{self.stage.fleets['v2'].gateway_urls[-1]}/rollout/cancel"
        for _ in range(20):  # its gateway may be the one just killed
            try:
                response = httpx.post(url, json=selector, timeout=30)
                return json.dumps(response.json())[-200:]
            except httpx.TransportError:
                url = f"{self.stage.fleets['v2'].gateway_url}/rollout/cancel"
                time.sleep(0.5)
        return "unreachable"

    def _cancel_id(self, fault: Fault) -> str:
        rollout_id = self._pick(fault.protocol, fault.pick)
        return self._cancel(fault.protocol, [rollout_id], "id") if rollout_id else "none yet"

    def _cancel_prefix(self, fault: Fault) -> str:
        """v2 only (v1 has no selector): every rollout of one group, as far as admitted."""
        group = f"v2-g{int(fault.pick * GROUPS)}-"
        self.cancelled_groups.append(group)
        return self._v2_cancel({"prefix": group})

    def _cancel_all(self, fault: Fault) -> str:
        self.cancel_all_at.append(time.time())
        return self._v2_cancel({"all": True})

    def _cancel_delivering(self, fault: Fault) -> str:
        """A v1 cancel while its completion callback is on the wire."""
        client = self.stage.redis()
        try:
            for record in client.zrange(f"{PREFIX['v1']}:active", 0, -1):
                if client.hget(record, "status") == "delivering":
                    rollout_id = record.split(":", 2)[2]
                    return self._cancel("v1", [rollout_id], "delivering")
        finally:
            client.close()
        return "none delivering"

    def _revoke(self, fault: Fault) -> str:
        """Flower's Revoke button: a Celery revoke of a running rollout's task id."""
        client = self.stage.redis()
        try:
            prefix = PREFIX[fault.protocol]
            running = client.zrange(f"{prefix}:leases", 0, -1)
            if not running:
                return "none running"
            record = running[int(fault.pick * len(running))]
            task_id = client.hget(record, "task")
        finally:
            client.close()
        if not task_id:
            return "no task id"
        self.cancelled.setdefault(record.split(":", 2)[2], []).append("revoke")
        app = Celery(broker=self.stage.primary().url)
        try:
            app.control.revoke(task_id)
        finally:
            app.close()
        return task_id

    def _readmit(self, fault: Fault) -> str:
        """A trainer sends an admitted id again (v1: replays its 202; v2: 409 duplicate)."""
        rollout_id = self._pick(fault.protocol, fault.pick)
        if rollout_id is None:
            return "none yet"
        fleet = self.stage.fleets[fault.protocol]
        path = "/v1/rollout/init" if fault.protocol == "v1" else "/rollout"
        try:
            response = httpx.post(f"{fleet.gateway_url}{path}", json=self.bodies[rollout_id])
        except httpx.TransportError:
            return "gateway down"
        self.readmitted[rollout_id] = response.status_code
        return f"{rollout_id}: {response.status_code}"


__all__ = ["CRASHES", "KINDS", "SENTINEL_KINDS", "Fault", "Nemesis", "schedule"]
