"""The stage: Redis holding two fleets, v1 and v2, with their own key prefixes and queues, each
with two gateways and three workers, and a mock TrainGate of their own.

Redis is one server (AOF), or, on the sentinel stage, a primary, a replica and three
sentinels: every fleet process is given the sentinels' URL, and admissions wait for the
replica (``ROLLOUT_FLEET_ADMISSION_REPLICAS``). Either server may be the primary at a given
moment: the sentinels say which."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.processes import ManagedProcess, free_port, port_open, wait_until
from rollout_fleet.redis_server import RedisServer, SentinelSet
from tests.chaos.harness import CHAOS_ENV, Protocol
from tests.harness import SCRIPTED_AGENT, SCRIPTED_V2_AGENT, MockTrainGateClient

WORKERS = 3
PREFIX: dict[Protocol, str] = {"v1": "n1", "v2": "n2"}
QUEUE: dict[Protocol, str] = {"v1": "q1", "v2": "q2"}
STAGE_ENV = {
    **CHAOS_ENV,
    "ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS": "2",
    "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS": "20",
    "OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "5",
}
# How long a failover may take: the sentinels' 2 s down-after, their vote, the promotion.
FAILOVER_SECONDS = 60.0


@dataclass
class Stage:
    workdir: Path
    sentinel: bool = False  # a primary, a replica and three sentinels; else one Redis
    admission_replicas: int = 1  # ROLLOUT_FLEET_ADMISSION_REPLICAS on the sentinel stage
    replica_lag: float = 0.0  # the replica is cut off this long before a failover's kill
    servers: list[RedisServer] = field(default_factory=list)  # the sentinel stage: two
    sentinels: SentinelSet | None = None
    failovers: list[dict[str, Any]] = field(default_factory=list)  # what each one took
    trainer_process: ManagedProcess = field(init=False)
    trainer: MockTrainGateClient = field(init=False)
    fleets: dict[Protocol, LocalFleet] = field(default_factory=dict)

    def start(self) -> Stage:
        self._start_redis()
        port = free_port()
        self.trainer_process = ManagedProcess(
            "mock-trainer",
            fleet_command("mock-trainer", "--port", str(port), "--responder", "calculator"),
            dict(os.environ),
            self.workdir / "mock-trainer.log",
        ).start()
        wait_until(lambda: port_open(port), 30, "the mock TrainGate")
        self.trainer = MockTrainGateClient(f"http://127.0.0.1:{port}")
        for protocol, agent in (("v1", SCRIPTED_AGENT), ("v2", SCRIPTED_V2_AGENT)):
            env = {
                **STAGE_ENV,
                **self._replication_env(),
                "ROLLOUT_FLEET_KEY_PREFIX": PREFIX[protocol],
                "ROLLOUT_FLEET_QUEUE": QUEUE[protocol],
            }
            self.fleets[protocol] = LocalFleet(
                agent=agent,
                redis_url=self.redis_url,
                workers=WORKERS,
                concurrency=60,
                gateways=2,
                env=env,
                log_dir=self.workdir / protocol,
            ).start()
        return self

    def _start_redis(self) -> None:
        primary = RedisServer(data_dir=self.workdir / "redis").start()
        self.servers = [primary]
        if not self.sentinel:
            return
        replica = RedisServer(data_dir=self.workdir / "redis-b", replica_of=primary.port).start()
        self.servers.append(replica)
        self.sentinels = SentinelSet(primary.port, self.workdir / "sentinels").start()
        self._wait_standby(replica, primary.port)

    def _replication_env(self) -> dict[str, str]:
        if self.sentinels is None:
            return {}
        return {
            "ROLLOUT_FLEET_SENTINEL_MASTER": SentinelSet.MASTER,
            "ROLLOUT_FLEET_ADMISSION_REPLICAS": str(self.admission_replicas),
        }

    @property
    def redis_url(self) -> str:
        """Every fleet process's ``REDIS_URL``: the sentinels', on the sentinel stage."""
        return self.sentinels.url(0) if self.sentinels else self.servers[0].url

    def primary(self) -> RedisServer:
        """The server the sentinels name as primary now (the only one, without them)."""
        if self.sentinels is None:
            return self.servers[0]
        port = self.sentinels.primary()
        return next(server for server in self.servers if server.port == port)

    def replica(self) -> RedisServer:
        return next(server for server in self.servers if server is not self.primary())

    def redis(self) -> redis.Redis:
        """A client of the primary (what the checker and the operators' faults read)."""
        return redis.Redis.from_url(self.primary().url, decode_responses=True)

    def record_key(self, protocol: Protocol, rollout_id: str) -> str:
        return f"{PREFIX[protocol]}:{protocol}:{rollout_id}"

    def restart_redis(self) -> None:
        """``kill -9`` of Redis, then a restart on its port and data (the AOF). On the sentinel
        stage that is the replica's (the primary's death is a failover): it comes back as the
        primary's replica and resyncs."""
        if self.sentinels is None:
            _kill(self.servers[0])
            self.servers[0].start()
            return
        primary, replica = self.primary(), self.replica()
        _kill(replica)
        replica.replica_of = primary.port
        replica.start(timeout=30)
        self._wait_standby(replica, primary.port)

    def failover(self, crash: Callable[[], None]) -> dict[str, Any]:
        """``kill -9`` of the primary the sentinels name (after cutting the replica off for
        ``replica_lag`` seconds, if set); once they name the other, the killed server comes back
        as its replica (its own data is replaced by a full resync) and the sentinels see it
        fit to promote: another failover can follow. ``crash`` is called just before the kill.
        """
        old, new = self.primary(), self.replica()
        if self.replica_lag:
            _cut_off(new)
            time.sleep(self.replica_lag)
        crash()
        killed_at = time.monotonic()
        _kill(old)
        assert self.sentinels is not None
        ports = self.sentinels.ports
        # Every sentinel, not one: back too soon, the old primary (a replica now) would be
        # named primary by a sentinel that had not heard of the failover yet.
        wait_until(lambda: _all_name(ports, new.port), FAILOVER_SECONDS, "a failover")
        promoted = time.monotonic() - killed_at
        old.replica_of = new.port
        old.start(timeout=30)
        self._wait_standby(old, new.port)
        figures = {
            "killed": old.port,
            "promoted": new.port,
            "promoted_after_s": round(promoted, 2),
            "standby_after_s": round(time.monotonic() - killed_at, 2),
        }
        self.failovers.append(figures)
        return figures

    def _wait_standby(self, replica: RedisServer, primary_port: int) -> None:
        """Until ``replica`` is in sync with the primary and every sentinel agrees on the
        primary and counts ``replica`` as a healthy replica of it (one it would promote)."""
        assert self.sentinels is not None
        sentinels = self.sentinels

        def ready() -> bool:
            with redis.Redis(port=replica.port, decode_responses=True) as client:
                info = client.info("replication")
            if info.get("master_link_status") != "up" or info.get("master_port") != primary_port:
                return False
            return all(_sees_standby(port, replica.port, primary_port) for port in sentinels.ports)

        wait_until(ready, FAILOVER_SECONDS, f"redis {replica.port} as a standby", interval=0.1)

    def logs(self, tail: int = 3000) -> str:
        processes = [
            (f"{protocol} {name}", process)
            for protocol, fleet in self.fleets.items()
            for name, process in fleet.processes.items()
        ]
        if self.sentinels is not None:
            processes += [(f"sentinel {n}", p) for n, p in enumerate(self.sentinels.processes)]
        return "\n".join(f"--- {name} ---\n{p.output()[-tail:]}" for name, p in processes)

    def stop(self) -> None:
        for fleet in self.fleets.values():
            fleet.stop()
        self.trainer_process.stop()
        if self.sentinels is not None:
            self.sentinels.stop()
        for server in self.servers:
            server.stop()


def _kill(server: RedisServer) -> None:
    assert server.process is not None
    server.process.signal(signal.SIGKILL)
    server.process.stop()  # reaps it, closes its log


def _cut_off(replica: RedisServer) -> None:
    """The replica stops replicating but keeps what it has, and stays a replica the
    sentinels would promote: pointed at a port nobody listens on. (A frozen replica would not
    do: the kernel keeps receiving for it, and it catches up when it wakes.)"""
    with redis.Redis(port=replica.port) as client:
        client.replicaof("127.0.0.1", free_port())


def _all_name(sentinel_ports: list[int], primary_port: int) -> bool:
    """Whether every sentinel names ``primary_port`` as the primary."""
    for port in sentinel_ports:
        with redis.Redis(port=port, decode_responses=True) as sentinel:
            _, named = sentinel.sentinel_get_master_addr_by_name(SentinelSet.MASTER)
        if int(named) != primary_port:
            return False
    return True


def _sees_standby(sentinel_port: int, replica_port: int, primary_port: int) -> bool:
    with redis.Redis(port=sentinel_port, decode_responses=True) as sentinel:
        replicas = sentinel.sentinel_slaves(SentinelSet.MASTER)
    return _all_name([sentinel_port], primary_port) and any(
        r["port"] == replica_port and r["flags"] == "slave" and r["master-link-status"] == "ok"
        for r in replicas
    )
