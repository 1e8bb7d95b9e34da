"""Time the fleet's Redis could not answer does not count against a trainer's polling lease
(PROTOCOL.md §2.7, CONFORMANCE item 154).

A trainer polls its v2 rollouts through a Redis outage longer than the polling lease: a
``SIGSTOP`` of the redis-server (it stops answering without restarting: a partition, a long
AOF load or a failover look the same) or a restart. Every poll meanwhile fails (503), so no
lease can be renewed. Before, on Redis's return the first poll or sweep ended every one of
them ``failure / lease_expired`` (all 5 of 5 in the review's run). Now each ends with its
real result, and a rollout nobody polls still ends ``lease_expired``, a lease after Redis
came back. The trainer polls through one gateway until Redis is back and through the other
from then on: no poll of the second failed, nor did it serve one during the outage.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rollout_core.store.schema import Keys
from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV, V2_ENV
from tests.harness import LEASE_HEADER, SCRIPTED_V2_AGENT, TERMINAL, new_id, v2_body

POLLING_LEASE = 6.0  # seconds; the outage outlasts it
OUTAGE = 10.0
OUTAGE_AFTER = 2.0  # seconds from the admissions to the outage
RUN = OUTAGE_AFTER + OUTAGE + 3  # each polled rollout's sleep: it ends after the outage
POLLED = 4
SWEEP = float(TEST_ENV["ROLLOUT_FLEET_SWEEP_INTERVAL_SECONDS"])


@dataclass
class Trainer:
    """Polls one rollout until it is terminal, through ``before`` until ``back`` is set and
    through ``after`` from then on, noting every answer's status code."""

    before: str
    after: str
    back: threading.Event
    token: str
    rollout_id: str
    codes: list[int] = field(default_factory=list)

    def poll_to_the_end(self, give_up_at: float) -> dict[str, Any]:
        with httpx.Client(timeout=40) as http:
            while True:
                assert time.monotonic() < give_up_at, (self.rollout_id, self.codes)
                gateway = self.after if self.back.is_set() else self.before
                try:
                    answer = http.get(
                        f"{gateway}/rollout/{self.rollout_id}/result",
                        headers={LEASE_HEADER: self.token},
                    )
                except httpx.TransportError:
                    self.codes.append(0)
                    time.sleep(0.5)
                    continue
                self.codes.append(answer.status_code)
                if answer.status_code != 200:
                    time.sleep(0.5)  # a careful trainer's retry of a 503
                    continue
                body: dict[str, Any] = answer.json()
                if body["status"] in TERMINAL:
                    return body


def stall(server: RedisServer) -> None:
    assert server.process is not None
    server.process.signal(signal.SIGSTOP)
    time.sleep(OUTAGE)
    server.process.signal(signal.SIGCONT)


def restart(server: RedisServer) -> None:
    started = time.monotonic()
    server.stop()  # SIGTERM: Redis writes its AOF out and exits
    time.sleep(max(0.0, OUTAGE - (time.monotonic() - started)))
    server.start(timeout=30)


OUTAGES: dict[str, Callable[[RedisServer], None]] = {"stall": stall, "restart": restart}


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[tuple[LocalFleet, RedisServer]]:
    server = RedisServer(appendonly=True, data_dir=tmp_path / "redis").start()
    env = {
        **TEST_ENV,
        **V2_ENV,
        "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS": str(POLLING_LEASE),
    }
    fleet = LocalFleet(
        agent=SCRIPTED_V2_AGENT,
        redis_url=server.url,
        workers=1,
        gateways=2,
        mock_trainer="calculator",
        env=env,
        log_dir=tmp_path / "fleet",
    ).start()
    yield fleet, server
    if server.process is not None and server.process.alive():
        server.process.signal(signal.SIGCONT)
    fleet.stop()
    server.stop()


@pytest.mark.parametrize("outage", sorted(OUTAGES))
def test_154_a_trainer_polling_through_a_redis_outage_gets_its_real_results(
    stage: tuple[LocalFleet, RedisServer], outage: str
) -> None:
    fleet, server = stage
    first, second = fleet.gateway_urls
    trainers, unpolled, back = [], new_id("nobody-polls"), threading.Event()
    with httpx.Client(timeout=10) as http:
        for rollout_id in [*(new_id("polled") for _ in range(POLLED)), unpolled]:
            steps = [{"sleep": 60}] if rollout_id == unpolled else [{"sleep": RUN}, {"chat": {}}]
            body = v2_body(fleet.mock_trainer_url, rollout_id, metadata={"script": steps})
            admitted = http.post(f"{first}/rollout", json=body)
            assert admitted.status_code == 202, admitted.text
            if rollout_id != unpolled:
                token = admitted.json()["polling_lease_token"]
                trainers.append(Trainer(first, second, back, token, rollout_id))
    give_up_at = time.monotonic() + 120
    with ThreadPoolExecutor(POLLED) as pool:
        results = [pool.submit(trainer.poll_to_the_end, give_up_at) for trainer in trainers]
        time.sleep(OUTAGE_AFTER)
        OUTAGES[outage](server)
        back.set()
        back_at = time.time()
        finals = [result.result() for result in results]
    refused = sum(code != 200 for trainer in trainers for code in trainer.codes)
    assert refused, "no poll failed: there was no outage to the trainer"
    for trainer, final in zip(trainers, finals, strict=True):
        assert final["status"] == "success", (final, trainer.codes)
        assert final["sample"]["reward"] == 1.0, final
        assert final["sample"]["messages"][-1]["role"] == "assistant", final
    with redis.Redis.from_url(server.url, decode_responses=True) as store:
        key = Keys(fleet.key_prefix).record("v2", unpolled)
        deadline = time.monotonic() + POLLING_LEASE + 4 * SWEEP + 10
        while store.hget(key, "status") not in TERMINAL:
            assert time.monotonic() < deadline, store.hgetall(key)
            time.sleep(0.2)
        record = store.hgetall(key)
    assert '"err_category":"lease_expired"' in record["result"], record
    # A lease (from Redis's return), plus a sweep, plus a loaded machine's slack.
    assert int(record["finished_at"]) / 1000 < back_at + POLLING_LEASE + 2 * SWEEP + 5, record
    logs = "".join(process.output() for process in fleet.processes.values())
    assert "Redis did not answer the fleet for" in logs
