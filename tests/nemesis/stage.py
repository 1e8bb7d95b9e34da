"""The stage: one Redis (AOF) holding two fleets, v1 and v2, with their own key prefixes and
queues, each with two gateways and three workers, and a mock TrainGate of their own."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import redis

from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.processes import ManagedProcess, free_port, port_open, wait_until
from rollout_fleet.redis_server import RedisServer
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


@dataclass
class Stage:
    workdir: Path
    redis_server: RedisServer = field(init=False)
    trainer_process: ManagedProcess = field(init=False)
    trainer: MockTrainGateClient = field(init=False)
    fleets: dict[Protocol, LocalFleet] = field(default_factory=dict)

    def start(self) -> Stage:
        self.redis_server = RedisServer(data_dir=self.workdir / "redis").start()
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
                "ROLLOUT_FLEET_KEY_PREFIX": PREFIX[protocol],
                "ROLLOUT_FLEET_QUEUE": QUEUE[protocol],
            }
            self.fleets[protocol] = LocalFleet(
                agent=agent,
                redis_url=self.redis_server.url,
                workers=WORKERS,
                concurrency=60,
                gateways=2,
                env=env,
                log_dir=self.workdir / protocol,
            ).start()
        return self

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_server.url, decode_responses=True)

    def record_key(self, protocol: Protocol, rollout_id: str) -> str:
        return f"{PREFIX[protocol]}:{protocol}:{rollout_id}"

    def restart_redis(self) -> None:
        """``kill -9`` of Redis, then a restart on its port and data (the AOF)."""
        assert self.redis_server.process is not None
        self.redis_server.process.signal(signal.SIGKILL)
        self.redis_server.process.stop()
        self.redis_server.start()

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {protocol} {name} ---\n{process.output()[-tail:]}"
            for protocol, fleet in self.fleets.items()
            for name, process in fleet.processes.items()
        )

    def stop(self) -> None:
        for fleet in self.fleets.values():
            fleet.stop()
        self.trainer_process.stop()
        self.redis_server.stop()
