"""What the OS says each process spent: CPU seconds between two points, and peak RSS.

Each role (``gateway``, ``workers``, ``redis``, ``baseline``) is a set of process trees; a
sampler thread keeps the peak of each role's summed RSS while a point runs. The driver (this
process, without its children) and the whole machine are measured too: on a machine the
driver and the mock TrainGate share with the server, they say how much of it was left.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil
from redis.asyncio import Redis

SAMPLE_SECONDS = 0.1


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(pids: list[int], reaped: bool = False) -> float:
    """CPU seconds of the process trees; with ``reaped``, also of the children each process
    has waited for (short-lived commands it ran, such as the ``docker`` CLI)."""
    total = 0.0
    for pid in pids:
        for process in _tree(pid):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
            if reaped:
                total += times.children_user + times.children_system
    return total


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def own_cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def established(pids: list[int]) -> int:
    """TCP connections the processes hold open (their clients' requests in progress)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(
                1
                for connection in psutil.Process(pid).net_connections("tcp")
                if connection.status == psutil.CONN_ESTABLISHED
            )
    return total


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for process in _tree(pid):
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
    return total


@dataclass
class Usage:
    """CPU seconds spent and peak RSS (MB) per role while the ``with`` block ran."""

    roles: Mapping[str, list[int]]
    connections_of: str | None = None  # also sample this role's open TCP connections
    reaped: bool = False  # count the commands the roles ran and waited for (cpu_seconds)
    cpu: dict[str, float] = field(default_factory=dict)
    driver_cpu: float = 0.0
    machine_busy: float = 0.0  # CPU seconds, all cores
    machine_capacity: float = 0.0  # wall seconds × cores
    peak_connections: int = 0
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    _start: dict[str, float] = field(default_factory=dict)
    _start_others: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    def __enter__(self) -> Usage:
        self._start = {role: cpu_seconds(pids, self.reaped) for role, pids in self.roles.items()}
        self._start_others = (own_cpu_seconds(), machine_busy_seconds(), time.monotonic())
        self.peak_rss_mb = {role: 0.0 for role in self.roles}
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._sampler is not None
        self._sampler.join()
        self.cpu = {
            role: cpu_seconds(pids, self.reaped) - self._start[role]
            for role, pids in self.roles.items()
        }
        driver, busy, started = self._start_others
        self.driver_cpu = own_cpu_seconds() - driver
        self.machine_busy = machine_busy_seconds() - busy
        self.machine_capacity = (time.monotonic() - started) * (psutil.cpu_count() or 1)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for role, pids in self.roles.items():
                mb = rss_bytes(pids) / 2**20
                self.peak_rss_mb[role] = max(self.peak_rss_mb[role], mb)
            if self.connections_of is not None:
                held = established(self.roles[self.connections_of])
                self.peak_connections = max(self.peak_connections, held)
            time.sleep(SAMPLE_SECONDS)


@dataclass
class RedisTraffic:
    """Commands Redis ran (by name, from ``INFO commandstats``) and bytes it received and
    sent while the ``async with`` block ran; nothing is measured without a Redis URL."""

    url: str | None
    commands: dict[str, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    _start: tuple[dict[str, int], int, int] = ({}, 0, 0)

    async def __aenter__(self) -> RedisTraffic:
        if self.url is not None:
            self._start = await _redis_counters(self.url)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.url is None:
            return
        calls, received, sent = await _redis_counters(self.url)
        before, received_before, sent_before = self._start
        self.commands = {
            name: count - before.get(name, 0)
            for name, count in calls.items()
            if count > before.get(name, 0)
        }
        # The two INFO calls of the measurement itself are not the fleet's.
        self.commands["info"] = self.commands.get("info", 0) - 1
        self.bytes_in, self.bytes_out = received - received_before, sent - sent_before

    def per_rollout(self, rollouts: int) -> dict[str, object]:
        if self.url is None:
            return {}
        by_name = {
            name: round(count / rollouts, 2)
            for name, count in sorted(self.commands.items(), key=lambda item: -item[1])
            if count > 0
        }
        return {
            "redis_commands_per_rollout": round(sum(self.commands.values()) / rollouts, 1),
            "redis_commands_by_name": by_name,
            "redis_kib_in_per_rollout": round(self.bytes_in / rollouts / 1024, 2),
            "redis_kib_out_per_rollout": round(self.bytes_out / rollouts / 1024, 2),
        }


async def _redis_counters(url: str) -> tuple[dict[str, int], int, int]:
    client = Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
        totals = await client.info("stats")
    finally:
        await client.aclose()
    calls = {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}
    return calls, int(totals["total_net_input_bytes"]), int(totals["total_net_output_bytes"])


IDLE_SECONDS = 5.0


async def idle_commands(system: Any) -> float:
    """Commands per second Redis runs for an idle fleet, per worker process."""
    traffic = RedisTraffic(system.redis_url)
    async with traffic:
        await asyncio.sleep(IDLE_SECONDS)
    workers = max(1, len(system.roles.get("workers", [])))
    return round(sum(traffic.commands.values()) / IDLE_SECONDS / workers, 1)
