"""Trainers that offer N rollouts with at most C in flight and time each one end to end.

v1: ``POST /v1/rollout/init``, done when the completion callback reaches the TrainGate (read
from the mock's ``/mock/completed`` feed). v2: ``POST /rollout``, then long-poll
``GET /rollout/{id}/result`` until a terminal status. Both talk to the fleet's gateway or to
an in-process server the same way: the driver cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel

from rollout_sdk.core.schemas import RolloutRequest
from rollout_sdk.types import POLLING_LEASE_HEADER, RolloutInitRequest, RolloutStatus

FEED_INTERVAL = 0.02
CALLBACK_WAIT_SECONDS = 600


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


class _Clients:
    """Requests spread round-robin over pools of about ``SHARD`` connections each.

    httpcore's pool bookkeeping grows with connections × waiting requests on every request
    (see ``HttpClientShards``); one pool for thousands of requests made the driver, not the
    server, the bottleneck.
    """

    SHARD = 64

    def __init__(self, concurrency: int, api_key: str | None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=self.SHARD)
        self._shards = [
            httpx.AsyncClient(limits=limits, headers=headers, timeout=httpx.Timeout(300))
            for _ in range(max(1, math.ceil(concurrency / self.SHARD)))
        ]
        self._turn = itertools.cycle(self._shards)

    async def get(self, url: str, **options: Any) -> httpx.Response:
        return await next(self._turn).get(url, **options)

    async def post(self, url: str, **options: Any) -> httpx.Response:
        return await next(self._turn).post(url, **options)

    async def __aenter__(self) -> _Clients:
        return self

    async def __aexit__(self, *_: object) -> None:
        for shard in self._shards:
            await shard.aclose()


async def _post(http: _Clients, url: str, body: BaseModel) -> httpx.Response:
    """Send a protocol model as the wire JSON a trainer sends (no unset fields)."""
    content = body.model_dump_json(exclude_none=True)
    return await http.post(url, content=content, headers={"Content-Type": "application/json"})


async def _offer(count: int, concurrency: int, one: Callable[[int], Any], run: Run) -> None:
    slots = asyncio.Semaphore(concurrency)

    async def bounded(index: int) -> None:
        async with slots:
            try:
                await one(index)
            except (httpx.HTTPError, TimeoutError) as exc:
                run.errors[type(exc).__name__] += 1

    started = time.perf_counter()
    await asyncio.gather(*(bounded(i) for i in range(count)))
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
    async with _Clients(concurrency, api_key) as http:
        since = (await http.get(f"{trainer}/mock/completed", params={"since": 0})).json()["next"]

        async def watch() -> None:
            nonlocal since
            while True:
                await asyncio.sleep(FEED_INTERVAL)
                try:
                    answer = await http.get(f"{trainer}/mock/completed", params={"since": since})
                except httpx.TransportError:
                    run.errors["traingate feed unreachable"] += 1
                    continue
                feed = answer.json()
                since = feed["next"]
                for rollout_id, at in feed["completed"]:
                    future = done.get(rollout_id)
                    if future is not None and not future.done():
                        future.set_result(at)

        async def one(index: int) -> None:
            body = bodies[index]
            future = done[body.rollout_id] = asyncio.get_running_loop().create_future()
            sent = time.time()
            response = await _post(http, f"{server}/v1/rollout/init", body)
            if response.status_code != 202:
                run.errors[f"init {response.status_code}"] += 1
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
) -> Run:
    """Offer v2 rollouts; each is done when a long-poll returns its terminal result."""
    run = Run(len(bodies))
    async with _Clients(concurrency, api_key) as http:

        async def one(index: int) -> None:
            body = bodies[index]
            sent = time.time()
            response = await _post(http, f"{server}/rollout", body)
            if response.status_code != 202:
                run.errors[f"admit {response.status_code}"] += 1
                return
            lease = {POLLING_LEASE_HEADER: response.json()["polling_lease_token"]}
            while True:
                polled = await http.get(f"{server}/rollout/{body.rollout_id}/result", headers=lease)
                if polled.status_code != 200:
                    run.errors[f"poll {polled.status_code}"] += 1
                    return
                status = RolloutStatus(polled.json()["status"])
                if status.terminal:
                    break
            run.latencies.append(time.time() - sent)
            if status is not RolloutStatus.SUCCESS:
                run.errors[f"rollout {status.value}"] += 1

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
    async with _Clients(concurrency, api_key) as http:
        start = time.perf_counter()

        async def one(index: int) -> None:
            if rate:
                await asyncio.sleep(max(0.0, start + index / rate - time.perf_counter()))
            body = bodies[index]
            sent = time.perf_counter()
            response = await _post(http, f"{server}/rollout", body)
            if response.status_code != 202:
                run.errors[f"admit {response.status_code}"] += 1
                return
            run.latencies.append(time.perf_counter() - sent)
            run.tokens[body.rollout_id] = response.json()["polling_lease_token"]

        await _offer(len(bodies), concurrency, one, run)
    return run


async def drive_long_polls(server: str, tokens: dict[str, str], api_key: str | None = None) -> Run:
    """One ``GET /rollout/{id}/result`` per admitted rollout, all open at once."""
    run = Run(len(tokens))
    async with _Clients(len(tokens), api_key) as http:

        async def one(index: int) -> None:
            rollout_id, token = items[index]
            sent = time.perf_counter()
            polled = await http.get(
                f"{server}/rollout/{rollout_id}/result", headers={POLLING_LEASE_HEADER: token}
            )
            if polled.status_code != 200:
                run.errors[f"poll {polled.status_code}"] += 1
                return
            run.latencies.append(time.perf_counter() - sent)

        items = list(tokens.items())
        await _offer(len(items), len(items), one, run)
    return run
