"""Redis trouble.

Against a Redis that stopped answering (blackholed: SIGSTOP, a dead host, a
partition) one call gives up within the store's retry budget (about 10 s) and the gateway
answers 503, instead of hanging (before: about 56 s, or for ever on an open connection).
After Redis was away (stopped, a long AOF load, a partition), sweepers leave lapsed
leases to their live holders.
And a Redis restarted without persistence under a running fleet is noticed.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from rollout_core.store.schema import Keys
from rollout_fleet.local import LocalFleet
from rollout_fleet.processes import wait_until
from rollout_fleet.redis_server import RedisServer
from tests.conftest import TEST_ENV
from tests.harness import (
    SCRIPTED_AGENT,
    MockTrainGateClient,
    PartitionProxy,
    new_id,
    script,
    v1_body,
)

# Three times the store's retry budget (RETRY_BUDGET_SECONDS, 10 s): a bound on hanging, not
# a speed target.
CLIENT_PATIENCE = 30.0


@pytest.fixture
def own_fleet(tmp_path: Path) -> Iterator[tuple[LocalFleet, RedisServer]]:
    server = RedisServer(data_dir=tmp_path / "redis").start()
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=server.url,
        workers=1,
        env=dict(TEST_ENV),
        log_dir=tmp_path / "fleet",
    ).start()
    yield fleet, server
    assert server.process is not None
    server.process.signal(signal.SIGCONT)
    fleet.stop()
    server.stop()


def test_a_blackholed_redis_gets_a_503_not_a_hang(
    own_fleet: tuple[LocalFleet, RedisServer],
) -> None:
    fleet, server = own_fleet
    body = v1_body("http://127.0.0.1:9", "before-stop")
    assert httpx.post(f"{fleet.gateway_url}/v1/rollout/init", json=body).status_code == 202
    assert server.process is not None
    server.process.signal(signal.SIGSTOP)
    started = time.monotonic()
    response = httpx.post(
        f"{fleet.gateway_url}/v1/rollout/init",
        json=v1_body("http://127.0.0.1:9", "while-stopped"),
        timeout=CLIENT_PATIENCE,
    )
    assert response.status_code == 503, response.text
    print(f"answered 503 after {time.monotonic() - started:.1f}s")
    server.process.signal(signal.SIGCONT)
    again = httpx.post(
        f"{fleet.gateway_url}/v1/rollout/init", json=v1_body("http://127.0.0.1:9", "after")
    )
    assert again.status_code == 202, again.text


LEASED = 10  # rollouts running when Redis goes away


def fleet_on(server: RedisServer, tmp_path: Path) -> LocalFleet:
    return LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=server.url,
        workers=2,
        mock_trainer="calculator",
        env=dict(TEST_ENV),
        log_dir=tmp_path / "fleet",
    ).start()


def running(fleet: LocalFleet, server: RedisServer, label: str, seconds: float) -> list[str]:
    """Admit ``LEASED`` rollouts that sleep ``seconds``; once all run, their record keys."""
    ids = [new_id(label) for _ in range(LEASED)]
    for rollout_id in ids:
        body = v1_body(fleet.mock_trainer_url, rollout_id, metadata=script({"sleep": seconds}))
        response = httpx.post(f"{fleet.gateway_url}/v1/rollout/init", json=body)
        assert response.status_code == 202, response.text
    records = [Keys(fleet.key_prefix).record("v1", i) for i in ids]
    wait_statuses(server, records, "running", 30)
    return records


def wait_statuses(server: RedisServer, records: list[str], status: str, timeout: float) -> None:
    with redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=None) as client:
        deadline = time.monotonic() + timeout
        while any(client.hget(r, "status") != status for r in records):
            assert time.monotonic() < deadline, [client.hgetall(r) for r in records]
            time.sleep(0.1)


def attempts(server: RedisServer, records: list[str]) -> list[str | None]:
    with redis.Redis.from_url(server.url, decode_responses=True) as client:
        return [client.hget(r, "attempt") for r in records]


def callbacks(trainer: MockTrainGateClient, records: list[str]) -> list[int]:
    """How many completion callbacks the mock TrainGate received for each record."""
    time.sleep(2)  # a second callback would come now
    deliveries = trainer.deliveries()
    return [len(deliveries.get(r.rsplit(":", 1)[1], [])) for r in records]


def test_a_redis_that_stopped_answering_does_not_make_sweepers_rerun_live_rollouts(
    tmp_path: Path,
) -> None:
    """Redis stops answering for two leases without restarting (a partition, a long AOF load,
    a failover look the same to the fleet): every lease lapses, yet its holder is alive. The
    sweepers leave them to their holders (before: Redis's uptime said nothing had happened,
    and sweepers could requeue live rollouts, which ran twice)."""
    server = RedisServer(data_dir=tmp_path / "redis").start()
    fleet = fleet_on(server, tmp_path)
    trainer = MockTrainGateClient(fleet.mock_trainer_url)
    assert server.process is not None
    try:
        records = running(fleet, server, "held", 10)
        server.process.signal(signal.SIGSTOP)
        time.sleep(2 * float(TEST_ENV["ROLLOUT_FLEET_LEASE_SECONDS"]))
        server.process.signal(signal.SIGCONT)
        wait_statuses(server, records, "success", 60)
        assert attempts(server, records) == ["1"] * LEASED
        assert callbacks(trainer, records) == [1] * LEASED
    finally:
        server.process.signal(signal.SIGCONT)
        fleet.stop()
        server.stop()


def test_a_redis_restart_whose_aof_load_outlasts_a_lease_reruns_nothing(
    tmp_path: Path,
) -> None:
    """As first seen: Redis restarts and loads its AOF for longer than a lease, so
    its uptime is past the lease when it answers again; sweepers took that for "no restart"
    and requeued live rollouts, which ran twice. Here the workers saw Redis loading, so they
    leave the leases to their holders."""
    lease = float(TEST_ENV["ROLLOUT_FLEET_LEASE_SECONDS"])
    server = RedisServer(appendonly=True, data_dir=tmp_path / "redis").start()
    ballast = redis.Redis.from_url(server.url_for(1), socket_timeout=None)
    ballast.execute_command("DEBUG", "POPULATE", 5_000_000, "ballast", 64)  # another database
    ballast.bgrewriteaof()  # a compact AOF that still takes seconds to load
    while ballast.info("persistence")["aof_rewrite_in_progress"]:
        time.sleep(0.2)
    ballast.close()
    fleet = fleet_on(server, tmp_path)
    assert server.process is not None
    try:
        records = running(fleet, server, "loading", 20)
        server.process.kill()
        started = time.monotonic()
        server.start(timeout=120)
        loaded = time.monotonic() - started
        if loaded < lease + 0.5:
            pytest.skip(f"the AOF loaded in {loaded:.1f}s, within a lease: nothing to see")
        wait_statuses(server, records, "success", 90)
        assert attempts(server, records) == ["1"] * LEASED, loaded
    finally:
        fleet.stop()
        server.stop()


# The partition test's lease: its two-lease hold-off after trouble outlasts the gap between
# the heals plus the holder's retry backoff (at most 2 s) by seconds.
PARTITION_LEASE = 4
HEAL_GAP = 3.0  # seconds from the idle worker's heal to the holder's
GIVE_UP_WAIT = 6.0  # twice the store's command timeout: a call gives up within it
PARTITIONED_SLEEP = 30  # each rollout's run: it outlasts the partition and both heals


def start_worker_through(fleet: LocalFleet, index: int, proxy: PartitionProxy) -> None:
    """Start worker ``index`` reaching Redis (its store and its broker) through ``proxy``;
    wait until the gateway counts it."""
    fleet.start_worker(index, {**fleet.process_env(), "REDIS_URL": proxy.url()})
    wait_until(lambda: fleet.readiness().workers >= index, 60, f"worker {index}")


def test_a_partition_healing_first_for_an_idle_worker_reruns_nothing(
    tmp_path: Path,
) -> None:
    """A partition without a restart that heals at different times for different
    hosts. Worker H runs every rollout, worker S none; both lose Redis (each through a proxy
    of its own) for longer than a lease, so H's leases lapse. S's path heals first, H's
    seconds later. Redis never restarted (its uptime is large), so S took H's leases for a
    dead worker's and requeued its live rollouts at once: each ran twice (attempt 2, H's
    execution stopped). Now S, having lost Redis itself, leaves lapsed leases alone for two
    leases, and H renews them first."""
    server = RedisServer(data_dir=tmp_path / "redis").start()
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=server.url,  # the gateway's: only the workers are cut off
        workers=0,
        mock_trainer="calculator",
        env={**TEST_ENV, "ROLLOUT_FLEET_LEASE_SECONDS": str(PARTITION_LEASE)},
        log_dir=tmp_path / "fleet",
    ).start()
    holder, idle = (PartitionProxy(("127.0.0.1", server.port)) for _ in range(2))
    trainer = MockTrainGateClient(fleet.mock_trainer_url)
    try:
        start_worker_through(fleet, 1, holder)
        records = running(fleet, server, "partitioned", PARTITIONED_SLEEP)
        start_worker_through(fleet, 2, idle)
        holder.cut()
        idle.cut()
        time.sleep(PARTITION_LEASE + 1)  # every lease has lapsed
        # Heal S just as one of its calls gives up (it counts Redis as away from then on), or
        # at the latest after the wait.
        idle.wait_for_give_up(GIVE_UP_WAIT)
        idle.heal()
        time.sleep(HEAL_GAP)  # S sweeps meanwhile: leases lapsed, Redis up for long
        holder.heal()
        wait_statuses(server, records, "success", 90)
        assert attempts(server, records) == ["1"] * LEASED
        assert callbacks(trainer, records) == [1] * LEASED
    finally:
        for proxy in (holder, idle):
            proxy.heal()  # the workers stop cleanly
        fleet.stop()
        for proxy in (holder, idle):
            proxy.close()
        server.stop()


def test_a_redis_restarted_without_persistence_unreadies_a_running_fleet(
    own_fleet: tuple[LocalFleet, RedisServer], tmp_path: Path
) -> None:
    """The data-loss check ran only at start: a Redis restarted without persistence under a
    running fleet went unnoticed (``/ready`` 200, nothing logged) until the next restart lost
    every admitted rollout. Now ``/ready`` fails naming it and the worker logs it."""
    fleet, durable = own_fleet
    ready_url = f"{fleet.gateway_url}/ready"
    assert httpx.get(ready_url, timeout=10).status_code == 200
    durable.stop()
    forgetful = RedisServer(port=durable.port, appendonly=False, data_dir=tmp_path / "r2").start()
    try:
        wait_until(
            lambda: httpx.get(ready_url, timeout=10).status_code == 503, 30, "/ready to fail"
        )
        ready = httpx.get(ready_url, timeout=10).json()
        assert ready["redis"] == "ok"
        assert "persistence is off" in ready["durability"]
        assert "ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS" in ready["durability"]
        worker = fleet.processes["worker-1"]
        wait_until(lambda: "persistence is off" in worker.output(), 30, "the worker to say so")
    finally:
        forgetful.stop()
