"""The fault schedule: drawn from a seed, applied while rollouts run.

Each kind is something the fleet must survive without breaking the promise. Every fault that
hits a process is remembered as a :class:`Crash`: which fleet, which process (name and pid),
when, and for a ``SIGSTOP`` when it was resumed. Only some may repeat a v1 callback (the
checker's ``EXCUSES``): a worker ``kill -9``-ed, or stopped past its lease, between the POST
and the write that records it, and a failover (the write may not have reached the replica).
A ``SIGTERM`` hands back cleanly and never hands back a delivering rollout: it excuses
nothing, unless the worker outlived the stop's grace and was killed (``sigterm_killed``).

The sentinel stage adds ``failover``: the primary the sentinels name is killed (``kill -9``),
the other server takes over, the killed one comes back as its replica, ready for the next
failover. It counts as a crash: the workers' Redis dies, and what the replica had not yet
received when it died (a few milliseconds of writes, more if ``--replica-lag`` cut it off)
is gone with it; only admissions wait for the replica. There ``redis_restart`` restarts the
replica (the primary's death being the failover): no fleet process talks to it, so it is no
crash; with ``ROLLOUT_FLEET_ADMISSION_REPLICAS=1`` admissions answer 503 until it is back.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import httpx
from celery import Celery

from rollout_core.protocols import cancelled_result
from rollout_core.queue.broker import control_exchange
from rollout_core.settings import FleetSettings
from rollout_core.store import RecordKey, RecordStore
from rollout_core.store.schema import Keys
from rollout_fleet.local import fleet_command
from rollout_fleet.redis_server import SentinelSet
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
GROUPS = 10  # rollout ids are <protocol>-g<group>-<n>: what a prefix cancel selects
LEASE = 3.0  # STAGE_ENV's lease
STOP_GRACE = 10.0  # a SIGTERM-ed worker still alive after this is killed
DELIVERING_SEARCH = 3.0  # seconds a delivery-window cancel looks for a delivering rollout


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


@dataclass(frozen=True)
class Crash:
    """A fault that hit a process: ``at`` (epoch seconds) it was hit; ``until``, when a
    stopped one was resumed (``at`` for the others). ``protocol`` is ``None`` for Redis, which
    every process of both fleets uses; then ``name`` is the server's port and ``pid`` 0."""

    at: float
    kind: str
    protocol: Protocol | None
    name: str
    pid: int
    until: float

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Nemesis:
    """Applies faults at their times (from its own thread) and remembers what it did."""

    stage: Stage
    faults: list[Fault]
    trainers: dict[Protocol, Trainer]  # their ``admitted`` grows as they go
    bodies: dict[str, dict[str, Any]]  # by rollout id, to re-admit
    log: list[dict[str, Any]] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)
    cancelled: dict[str, list[str]] = field(default_factory=dict)  # rollout id → how
    cancelled_groups: list[str] = field(default_factory=list)  # v2 id prefixes cancelled
    cancel_all_at: list[float] = field(default_factory=list)  # epoch times of v2 cancel-all
    readmitted: dict[str, int] = field(default_factory=dict)  # rollout id → status answered
    # each delivery-window cancel: the rollout, the cancel's answer, whether the record was
    # still delivering once the cancel had answered (so the cancel landed in the window)
    delivering_cancels: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self) -> Nemesis:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """Wait for the schedule to end; whether it did."""
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        started = time.monotonic()
        for fault in self.faults:
            time.sleep(max(0.0, fault.at - (time.monotonic() - started)))
            self.apply(fault)

    def apply(self, fault: Fault) -> str:
        """Apply one fault now (its ``at`` aside) and remember it; what it did."""
        try:
            done: str = getattr(self, f"_{fault.kind}")(fault)
        except Exception as exc:  # a fault that could not be applied is reported
            self.errors.append(f"{fault.kind}@{fault.at}: {type(exc).__name__}: {exc}")
            done = "error"
        self.log.append({**fault.describe(), "done": done, "epoch": time.time()})
        return done

    # --- processes ---------------------------------------------------------------------

    def _worker(self, fault: Fault) -> tuple[str, Any]:
        fleet = self.stage.fleets[fault.protocol]
        name = f"worker-{fault.index}"
        return name, fleet.processes[name]

    def _crash(
        self, kind: str, protocol: Protocol | None, name: str, pid: int, at: float | None = None
    ) -> Crash:
        at = time.time() if at is None else at
        crash = Crash(at, kind, protocol, name, pid, at)
        self.crashes.append(crash)
        return crash

    def _resumed(self, crash: Crash) -> None:
        self.crashes[self.crashes.index(crash)] = replace(crash, until=time.time())

    def _kill9(self, fault: Fault) -> str:
        name, process = self._worker(fault)
        self._crash("kill9", fault.protocol, name, process.pid)
        process.kill()
        time.sleep(0.5 + 1.5 * fault.pick)  # the supervisor's restart delay
        self.stage.fleets[fault.protocol].restart_dead_workers()
        return f"{name} ({process.pid})"

    def _sigstop(self, fault: Fault) -> str:
        name, process = self._worker(fault)
        crash = self._crash("sigstop", fault.protocol, name, process.pid)
        process.signal(signal.SIGSTOP)
        time.sleep(LEASE + 1 + 2 * fault.pick)  # past its lease: its rollouts go elsewhere
        process.signal(signal.SIGCONT)
        self._resumed(crash)
        return f"{name} ({process.pid})"

    def _sigterm(self, fault: Fault) -> str:
        """A graceful stop (a deploy): SIGTERM, its grace; killed only if it outlives that."""
        name, process = self._worker(fault)
        self._crash("sigterm", fault.protocol, name, process.pid)
        process.terminate()
        assert process.process is not None
        try:
            process.process.wait(STOP_GRACE)
            how = "stopped"
        except subprocess.TimeoutExpired:
            self._crash("sigterm_killed", fault.protocol, name, process.pid)
            process.kill()
            how = "killed past its grace"
        process.stop()  # reaped: closes its log
        self.stage.fleets[fault.protocol].restart_dead_workers()
        return f"{name} ({process.pid}) {how}"

    def _client_kill(self, fault: Fault) -> str:
        client = self.stage.redis()
        try:
            return str(client.client_kill_filter(_type="normal", skipme=True))
        finally:
            client.close()

    def _redis_restart(self, fault: Fault) -> str:
        if self.stage.sentinels is not None:  # the replica's: no fleet process uses it
            self._crash("replica_restart", None, str(self.stage.replica().port), 0)
            self.stage.restart_redis()
            return "replica restarted"
        self._crash("redis_restart", None, str(self.stage.primary().port), 0)
        self.stage.restart_redis()
        return "restarted"

    def _failover(self, fault: Fault) -> str:
        if self.stage.sentinels is None:
            raise RuntimeError("a failover needs the sentinel stage (--sentinel)")
        port = str(self.stage.primary().port)
        figures = self.stage.failover(lambda: self._crash("failover", None, port, 0))
        return json.dumps(figures)

    def _gateway_kill(self, fault: Fault) -> str:
        fleet = self.stage.fleets[fault.protocol]
        index = 1 + fault.index % 2
        name = "gateway" if index == 1 else f"gateway-{index}"
        self._crash("gateway_kill", fault.protocol, name, fleet.processes[name].pid)
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
        """A v1 cancel while its completion callback is on the wire: the first rollout seen
        delivering within ``DELIVERING_SEARCH`` seconds, cancelled at once through the store
        (what ``rollout-fleet cancel`` calls: the CLI alone takes longer to start than a
        callback to answer). Whether the cancel landed while it was delivering is read back:
        the record not yet finished once the cancel had answered."""
        client = self.stage.redis()
        deadline = time.monotonic() + DELIVERING_SEARCH
        try:
            while time.monotonic() < deadline:
                records = client.zrange(Keys(PREFIX["v1"]).leases, 0, -1)
                for record in records:
                    if client.hget(record, "status") == "delivering":
                        return self._cancel_now(client, record)
                time.sleep(0.02)
        finally:
            client.close()
        return "none delivering"

    def _cancel_now(self, client: Any, record: str) -> str:
        rollout_id = record.split(":", 2)[2]
        self.cancelled.setdefault(rollout_id, []).append("delivering")
        outcome = asyncio.run(self._store_cancel(record))
        status = client.hget(record, "status")
        landed = outcome == "finished" and status == "delivering"
        self.delivering_cancels.append(
            {"rollout_id": rollout_id, "outcome": outcome, "status_after": status, "landed": landed}
        )
        return f"{rollout_id}: {outcome} (then {status})"

    async def _store_cancel(self, record: str) -> str:
        settings = FleetSettings(
            REDIS_URL=self.stage.redis_url,
            key_prefix=PREFIX["v1"],
            sentinel_master=SentinelSet.MASTER,
        )
        store = RecordStore.connect(settings, max_connections=2)
        try:
            key = RecordKey(record)
            outcomes = await store.cancel(
                {key: cancelled_result(store.keys, key)}, settings.result_retention_seconds
            )
            return str(outcomes[key].value)
        finally:
            await store.aclose()

    def _revoke(self, fault: Fault) -> str:
        """Flower's Revoke button: a Celery revoke of a running rollout's task id."""
        client = self.stage.redis()
        try:
            prefix = PREFIX[fault.protocol]
            running = client.zrange(Keys(prefix).leases, 0, -1)
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
        app.conf.control_exchange = control_exchange(prefix)
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


__all__ = ["KINDS", "LEASE", "SENTINEL_KINDS", "Crash", "Fault", "Nemesis", "schedule"]
