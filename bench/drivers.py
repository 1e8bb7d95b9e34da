"""Trainers that offer N rollouts with at most C in flight and time each one end to end.

v1: ``POST /v1/rollout/init``, done when the completion callback reaches the TrainGate (read
from the mock's ``/mock/completed`` feed). v2: ``POST /rollout``, then long-poll
``GET /rollout/{id}/result`` until a terminal status. Both talk to the fleet's gateway or to
an in-process server the same way: the driver cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import BaseModel

from rollout_sdk.core.schemas import RolloutRequest
from rollout_sdk.types import POLLING_LEASE_HEADER, RolloutInitRequest, RolloutStatus

FEED_INTERVAL = 0.02
CALLBACK_WAIT_SECONDS = 600
REQUEST_TIMEOUT_SECONDS = 300
JSON = {"Content-Type": "application/json"}
# Idle pooled connections are dropped after this, under uvicorn's default server keep-alive
# (5 s; our in-process servers and upstream's keep it, the fleet's gateway holds 75 s):
# reusing one the server is closing at that moment fails the request
# (ServerDisconnectedError / connection reset), which upstream's server, whose long-polls
# return at each status change, hit a few times per 500 rollouts at C = 256.
KEEPALIVE_SECONDS = 4.0
FAILURES = (aiohttp.ClientError, TimeoutError)


@dataclass
class Run:
    """What one driver run saw."""

    offered: int
    wall_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def figures(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return (
                round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 1)
                if ordered
                else None
            )

        return {
            "offered": self.offered,
            "completed": len(self.latencies),
            "errors": dict(self.errors),
            "rollouts_per_s": round(len(self.latencies) / self.wall_seconds, 1),
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
        }


class _Client:
    """The trainer's HTTP client. aiohttp, because the driver shares the machine with the
    system under test and must take little of it: at C = 64 httpx cost the driver 2.2 ms of
    CPU per no-op v2 rollout (one admission, one poll) and saturated a core, so the driver,
    not the server, set the pace; aiohttp costs 0.6 ms (CHANGELOG.md)."""

    def __init__(self, api_key: str | None) -> None:
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> _Client:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS),
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._session is not None
        await self._session.close()

    async def get(
        self, url: str, headers: dict[str, str] | None = None, params: dict[str, int] | None = None
    ) -> tuple[int, Any]:
        """``(status, JSON body)``."""
        assert self._session is not None
        async with self._session.get(url, headers=headers, params=params) as response:
            return response.status, await response.json()

    async def post(self, url: str, body: BaseModel) -> tuple[int, Any]:
        """Send a protocol model as the wire JSON a trainer sends (no unset fields)."""
        assert self._session is not None
        content = body.model_dump_json(exclude_none=True)
        async with self._session.post(url, data=content, headers=JSON) as response:
            return response.status, await response.json()


async def _offer(
    count: int, concurrency: int, one: Callable[[int], Any], run: Run, rate: float | None = None
) -> None:
    """Start ``one(i)`` for i < count as slots free up (at most ``concurrency`` at once) and,
    with ``rate``, no earlier than i / rate seconds in. A request's task is made when it is
    sent, not all up front: thousands of waiting tasks made at once held the loop for tens of
    milliseconds and showed up as the first requests' latency."""
    slots = asyncio.Semaphore(concurrency)

    async def bounded(index: int) -> None:
        try:
            await one(index)
        except FAILURES as exc:
            run.errors[type(exc).__name__] += 1
        finally:
            slots.release()

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for index in range(count):
            if rate:
                await asyncio.sleep(max(0.0, started + index / rate - time.perf_counter()))
            await slots.acquire()
            group.create_task(bounded(index))
    run.wall_seconds = time.perf_counter() - started


async def drive_v1(
    server: str,
    trainer: str,
    bodies: Sequence[RolloutRequest],
    concurrency: int,
    api_key: str | None = None,
) -> Run:
    """Offer v1 rollouts; each is done when its callback reaches ``trainer``."""
    run = Run(len(bodies))
    done: dict[str, asyncio.Future[float]] = {}
    async with _Client(api_key) as http:
        since = (await http.get(f"{trainer}/mock/completed", params={"since": 0}))[1]["next"]

        async def watch() -> None:
            nonlocal since
            while True:
                await asyncio.sleep(FEED_INTERVAL)
                try:
                    _, feed = await http.get(f"{trainer}/mock/completed", params={"since": since})
                except aiohttp.ClientConnectionError:
                    run.errors["traingate feed unreachable"] += 1
                    continue
                since = feed["next"]
                for rollout_id, at in feed["completed"]:
                    future = done.get(rollout_id)
                    if future is not None and not future.done():
                        future.set_result(at)

        async def one(index: int) -> None:
            body = bodies[index]
            future = done[body.rollout_id] = asyncio.get_running_loop().create_future()
            sent = time.time()
            status, _ = await http.post(f"{server}/v1/rollout/init", body)
            if status != 202:
                run.errors[f"init {status}"] += 1
                return
            async with asyncio.timeout(CALLBACK_WAIT_SECONDS):
                run.latencies.append(await future - sent)

        watcher = asyncio.create_task(watch())
        try:
            await _offer(len(bodies), concurrency, one, run)
        finally:
            watcher.cancel()
    return run


async def drive_v2(
    server: str,
    bodies: Sequence[RolloutInitRequest],
    concurrency: int,
    api_key: str | None = None,
    results: dict[str, Any] | None = None,
) -> Run:
    """Offer v2 rollouts; each is done when a long-poll returns its terminal result (kept in
    ``results``, by rollout id, when given)."""
    run = Run(len(bodies))
    async with _Client(api_key) as http:

        async def one(index: int) -> None:
            body = bodies[index]
            sent = time.time()
            status, admitted = await http.post(f"{server}/rollout", body)
            if status != 202:
                run.errors[f"admit {status}"] += 1
                return
            lease = {POLLING_LEASE_HEADER: admitted["polling_lease_token"]}
            while True:
                status, polled = await http.get(
                    f"{server}/rollout/{body.rollout_id}/result", headers=lease
                )
                if status != 200:
                    run.errors[f"poll {status}"] += 1
                    return
                outcome = RolloutStatus(polled["status"])
                if outcome.terminal:
                    break
            run.latencies.append(time.time() - sent)
            if results is not None:
                results[body.rollout_id] = polled
            if outcome is not RolloutStatus.SUCCESS:
                run.errors[f"rollout {outcome.value}"] += 1

        await _offer(len(bodies), concurrency, one, run)
    return run


@dataclass
class Admissions(Run):
    tokens: dict[str, str] = field(default_factory=dict)  # rollout id → polling lease token


async def drive_admissions(
    server: str,
    bodies: Sequence[RolloutInitRequest],
    concurrency: int,
    rate: float | None = None,
    api_key: str | None = None,
) -> Admissions:
    """``POST /rollout`` only, as fast as ``concurrency`` allows or paced at ``rate``/s;
    latency is the admission's round trip."""
    run = Admissions(len(bodies))
    async with _Client(api_key) as http:

        async def one(index: int) -> None:
            body = bodies[index]
            sent = time.perf_counter()
            status, admitted = await http.post(f"{server}/rollout", body)
            if status != 202:
                run.errors[f"admit {status}"] += 1
                return
            run.latencies.append(time.perf_counter() - sent)
            run.tokens[body.rollout_id] = admitted["polling_lease_token"]

        await _offer(len(bodies), concurrency, one, run, rate)
    return run


async def drive_long_polls(server: str, tokens: dict[str, str], api_key: str | None = None) -> Run:
    """One ``GET /rollout/{id}/result`` per admitted rollout, all open at once."""
    run = Run(len(tokens))
    items = list(tokens.items())
    async with _Client(api_key) as http:

        async def one(index: int) -> None:
            rollout_id, token = items[index]
            sent = time.perf_counter()
            status, _ = await http.get(
                f"{server}/rollout/{rollout_id}/result", headers={POLLING_LEASE_HEADER: token}
            )
            if status != 200:
                run.errors[f"poll {status}"] += 1
                return
            run.latencies.append(time.perf_counter() - sent)

        await _offer(len(items), len(items), one, run)
    return run
