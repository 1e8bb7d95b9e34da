"""A v1 callback is posted once even when Redis stops answering right after the trainer
answered it, for longer than the store's retry budget (≈ 10 s) and longer than the lease.

Real processes: a redis-server of the test's own, a gateway and a worker, and a trainer in
this process that takes Redis away the moment a callback arrives, then answers 200. Away is
either a stopped redis-server (SIGSTOP) or a partition between the worker and Redis (a proxy
that holds everything, and drops what a connection the worker gave up had not delivered:
the write recording the answer is then lost, not applied late). The worker cannot record
the answer until Redis is back: it keeps trying with the execution still holding the lease,
so no sweeper hands the stored result to a worker to post again, not even a worker that
starts as Redis comes back (it never saw the outage).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rollout_core.store.schema import Keys
from rollout_fleet.local import LocalFleet
from rollout_fleet.processes import wait_until
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV
from tests.harness import SCRIPTED_AGENT, PartitionProxy, new_id, script, v1_body

LEASE = 15.0  # the default lease: the longer freeze outlasts it
ROLLOUTS = 3
SETTLE = 5.0  # after every record ended: time for a repeat to show


class FreezingTrainer:
    """Receives completion callbacks; the first one takes Redis away (``freeze``) before it
    is answered 200, so the worker's write recording the answer meets a Redis that is away."""

    def __init__(self, freeze: Callable[[], None]) -> None:
        self._freeze = freeze
        self.frozen = threading.Event()
        self.lock = threading.Lock()
        self.callbacks: dict[str, list[dict[str, Any]]] = defaultdict(list)
        trainer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/v1/rollout/completed"):
                    trainer.received(body)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def received(self, body: dict[str, Any]) -> None:
        with self.lock:
            self.callbacks[body["rollout_id"]].append(body)
            if not self.frozen.is_set():
                self._freeze()
                self.frozen.set()

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {rollout_id: len(bodies) for rollout_id, bodies in self.callbacks.items()}

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


def wait_ended(client: redis.Redis, records: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(client.hget(r, "status") not in {"success", "failure"} for r in records):
        assert time.monotonic() < deadline, [client.hgetall(r) for r in records]
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("fault", "away_for"),
    [("sigstop", 14.0), ("sigstop", 20.0), ("partition", 14.0), ("partition", 20.0)],
    ids=[
        "sigstop-past-the-retry-budget",
        "sigstop-past-the-lease",
        "partition-past-the-retry-budget",
        "partition-past-the-lease",
    ],
)
def test_a_callback_whose_answer_meets_redis_away_is_posted_once(
    tmp_path: Path, fault: str, away_for: float
) -> None:
    server = RedisServer(data_dir=tmp_path / "redis").start()
    assert server.process is not None
    process = server.process
    proxy = PartitionProxy(("127.0.0.1", server.port))
    if fault == "sigstop":
        freeze, thaw = (
            (lambda: process.signal(signal.SIGSTOP)),
            (lambda: process.signal(signal.SIGCONT)),
        )
    else:
        freeze, thaw = proxy.cut, proxy.heal
    trainer = FreezingTrainer(freeze)
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=server.url,  # the gateway's; the first worker's goes through the proxy
        workers=0,
        env={**TEST_ENV, "ROLLOUT_FLEET_LEASE_SECONDS": str(LEASE)},
        log_dir=tmp_path / "fleet",
    )
    client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=None)
    try:
        fleet.start()
        fleet.start_worker(1, {**fleet.process_env(), "REDIS_URL": proxy.url()})
        wait_until(lambda: fleet.readiness().workers >= 1, 60, "the worker")
        ids = [new_id("outage") for _ in range(ROLLOUTS)]
        for rollout_id in ids:  # they end together: their callbacks go out together
            body = v1_body(
                trainer.url, rollout_id, metadata=script({"sleep": 1.0}, {"complete": {}})
            )
            response = httpx.post(f"{fleet.gateway_url}/v1/rollout/init", json=body, timeout=30)
            assert response.status_code == 202, response.text
        assert trainer.frozen.wait(60), "no callback came"
        time.sleep(away_for)
        thaw()
        # A worker that starts as Redis comes back never saw the outage: it must not take
        # over the rollouts whose holder is still trying to record the trainer's answer.
        fleet.start_worker(2)
        records = [Keys(fleet.key_prefix).record("v1", rollout_id) for rollout_id in ids]
        wait_ended(client, records, 2 * LEASE + 30)
        time.sleep(SETTLE)
        assert trainer.counts() == dict.fromkeys(ids, 1), fleet_logs(fleet)
        for record in records:
            fields = client.hgetall(record)
            assert (fields["status"], fields["delivery"]) == ("success", "delivered"), fields
        assert client.zcard(Keys(fleet.key_prefix).leases) == 0
    finally:
        process.signal(signal.SIGCONT)
        proxy.heal()
        fleet.stop()
        trainer.close()
        client.close()
        proxy.close()
        server.stop()


def fleet_logs(fleet: LocalFleet) -> str:
    return "\n".join(
        f"--- {name} ---\n{process.output()[-3000:]}" for name, process in fleet.processes.items()
    )
