"""A burst of v1 rollouts into a Redis too small for all of them: what the gateway admits
ends, exactly once, at the pace it would without the limit; what it cannot hold it refuses.

Real processes: a redis-server of its own for each run, one gateway, two workers of 20
slots, the scripted agent taking 0.3 s (so a backlog builds: the gateway admits faster than
the workers finish). First a burst of BASELINE rollouts with no ``maxmemory``: it gives the
drain rate (rollouts finished per second from when admission stopped, at its first refusal
or the burst's end, until as many as were unfinished then have finished) and what
that many admissions take in memory. Then BURST rollouts (the 20 000 measured by hand) with
``maxmemory`` at that much: Redis holds about a third of them, so it fills during the burst.
Before admissions kept room for admitted rollouts to end, results and renewals were refused
at ``maxmemory``: rollouts ran twice or three times, ended ``lease_expired``, and the drain
fell a hundredfold. The baseline is smaller than the burst only to keep the test within a
few minutes on two cores (admission runs at ~200/s there): it admits about as many rollouts
as the limited burst does, so both drain a backlog of like size.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from rollout_core.store.schema import Keys
from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV
from tests.harness import SCRIPTED_AGENT, MockTrainGateClient, start_mock_trainer, v1_body

BASELINE = 6_000
BURST = 20_000
SENDERS = 64  # requests in flight at once, like a trainer's client pool
AGENT_SECONDS = 0.3
DRAIN_TIMEOUT = 120.0
SCRIPT = [{"sleep": AGENT_SECONDS}, {"complete": {}}]


@dataclass
class Burst:
    admitted: list[str]
    refused: Counter[int]
    admitting_seconds: float
    drain_per_second: float
    backlog: int  # unfinished when admission stopped (its first refusal, or the burst's end)
    peak_used: int
    base_used: int


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockTrainGateClient]:
    process, client = start_mock_trainer("calculator", tmp_path_factory.mktemp("burst-trainer"))
    yield client
    process.stop()


@dataclass
class Sent:
    admitted: list[str] = field(default_factory=list)
    refused: Counter[int] = field(default_factory=Counter)
    first_refusal: float | None = None  # monotonic


async def _send(url: str, bodies: list[dict[str, object]]) -> Sent:
    sent = Sent()
    queue: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    limits = httpx.Limits(max_connections=SENDERS, max_keepalive_connections=SENDERS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

        async def sender() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                response = await http.post("/v1/rollout/init", json=body)
                if response.status_code == 202:
                    sent.admitted.append(str(body["rollout_id"]))
                else:
                    sent.refused[response.status_code] += 1
                    if sent.first_refusal is None:
                        sent.first_refusal = time.monotonic()

        await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return sent


class Sampler:
    """(time, unfinished, finished) every 0.1 s from Redis, in a thread, and the peak of
    ``used_memory``."""

    def __init__(self, url: str, keys: Keys) -> None:
        self._store = redis.Redis.from_url(url, decode_responses=True)
        self._keys = keys
        self.samples: list[tuple[float, int, int]] = []
        self.peak_used = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.1):
            pipe = self._store.pipeline(transaction=False)
            pipe.zcard(self._keys.active)
            pipe.zcard(self._keys.finished)
            pipe.info("memory")
            active, finished, memory = pipe.execute()
            self.samples.append((time.monotonic(), int(active), int(finished)))
            self.peak_used = max(self.peak_used, int(memory["used_memory"]))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._store.close()

    def drain_rate(self, since: float) -> tuple[float, int]:
        """Rollouts finished per second from ``since`` until the ones unfinished then had
        been worked off (as many finishes), or until the last sample; and that backlog."""
        after = [sample for sample in self.samples if sample[0] >= since]
        start, backlog, finished = after[0]
        end = next((s for s in after if s[2] >= finished + backlog), after[-1])
        return (end[2] - finished) / max(end[0] - start, 0.001), backlog


def _burst(
    trainer: MockTrainGateClient, log_dir: Path, label: str, rollouts: int, maxmemory: int | None
) -> tuple[Burst, redis.Redis, Keys]:
    server = RedisServer().start()
    store = redis.Redis.from_url(server.url_for(0), decode_responses=True)
    base_used = int(store.info("memory")["used_memory"])
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=server.url_for(0),
        workers=2,
        concurrency=20,
        env=dict(TEST_ENV),
        log_dir=log_dir / label,
    )
    fleet.start()
    try:
        if maxmemory is not None:
            store.config_set("maxmemory", str(maxmemory))
        bodies: list[dict[str, object]] = [
            v1_body(trainer.url, f"{label}-{index}", metadata={"script": SCRIPT})
            for index in range(rollouts)
        ]
        keys = Keys(fleet.key_prefix)
        sampler = Sampler(server.url_for(0), keys)
        started = time.monotonic()
        sent = asyncio.run(_send(fleet.gateway_url, bodies))
        sent_at = time.monotonic()
        deadline = sent_at + DRAIN_TIMEOUT
        while store.zcard(keys.active) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.3)  # a last sample
        sampler.stop()
        # Admission stopped at its first refusal (the store full), else with the burst.
        rate, backlog = sampler.drain_rate(sent.first_refusal or sent_at)
        burst = Burst(
            sent.admitted,
            sent.refused,
            sent_at - started,
            rate,
            backlog,
            sampler.peak_used,
            base_used,
        )
        return burst, store, keys
    finally:
        fleet.stop()
        if maxmemory is not None:
            store.config_set("maxmemory", "0")  # the reads below must not be refused
        # The server is stopped by the caller's finalizer, after the records are read.
        _servers.append(server)


_servers: list[RedisServer] = []


@pytest.fixture(autouse=True)
def _stop_servers() -> Iterator[None]:
    yield
    while _servers:
        _servers.pop().stop()


def _check_ended_once(
    trainer: MockTrainGateClient, store: redis.Redis, keys: Keys, admitted: list[str]
) -> dict[str, int]:
    """Every admitted rollout called back once and ran once; figures of what did not."""
    deliveries = trainer.deliveries()
    calls = Counter({rollout: len(deliveries.get(rollout, [])) for rollout in admitted})
    pipe = store.pipeline(transaction=False)
    for rollout in admitted:
        pipe.hmget(keys.record("v1", rollout), ["status", "attempt", "terminations"])
    records = pipe.execute()
    statuses = Counter(str(record[0]) for record in records)
    return {
        "admitted": len(admitted),
        "called_back_once": sum(1 for n in calls.values() if n == 1),
        "never_called_back": sum(1 for n in calls.values() if n == 0),
        "called_back_twice_or_more": sum(1 for n in calls.values() if n > 1),
        "ran_more_than_once": sum(1 for r in records if int(r[1] or 0) > 1),
        "terminated_not_once": sum(1 for r in records if r[2] != "1"),
        "success": statuses["success"],
    }


def test_a_full_redis_admits_only_what_can_end_and_drains_at_full_pace(
    trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    free, free_store, free_keys = _burst(trainer, tmp_path, "free", BASELINE, None)
    assert len(free.admitted) == BASELINE, free.refused
    baseline = _check_ended_once(trainer, free_store, free_keys, free.admitted)
    assert baseline["called_back_once"] == BASELINE, baseline
    maxmemory = free.peak_used  # what BASELINE rollouts took, once ended
    trainer.reset()

    full, store, keys = _burst(trainer, tmp_path, "full", BURST, maxmemory)
    figures = _check_ended_once(trainer, store, keys, full.admitted)
    report = {
        "baseline_rollouts": BASELINE,
        "burst_rollouts": BURST,
        "maxmemory": maxmemory,
        "unlimited_peak_used": free.peak_used,
        "limited_peak_used": full.peak_used,
        "unlimited_drain_per_s": round(free.drain_per_second, 1),
        "limited_drain_per_s": round(full.drain_per_second, 1),
        "unlimited_backlog": free.backlog,
        "limited_backlog": full.backlog,
        "limited_admitted": len(full.admitted),
        "limited_refused": dict(full.refused),
        "unlimited_admitting_s": round(free.admitting_seconds, 1),
        "limited_admitting_s": round(full.admitting_seconds, 1),
        **figures,
    }
    print("burst figures:", json.dumps(report))
    assert free.backlog > 0, report  # else there was no drain to measure
    assert full.refused, f"maxmemory was never reached: {report}"
    assert set(full.refused) == {503}, report  # v1's answer to a full store
    assert figures["called_back_once"] == len(full.admitted), report
    assert figures["ran_more_than_once"] == 0, report
    assert figures["terminated_not_once"] == 0, report
    assert figures["success"] == len(full.admitted), report
    assert full.drain_per_second * 2 >= free.drain_per_second, report
    free_store.close()
    store.close()
