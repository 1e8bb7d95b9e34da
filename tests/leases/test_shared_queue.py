"""Two fleets on one real Redis database with different key prefixes and the same queue name.
Before: nothing noticed; each fleet's workers took and ran the other's rollouts (the intake
claimed any record key it was handed). And two fleets with their own prefixes and queues
share kombu's taken set: each fleet's sweeper keeps to its own fleet's messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import redis

from rollout_core.store.schema import UNACKED, UNACKED_INDEX, Keys
from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.processes import free_port, wait_until
from tests.conftest import TEST_ENV, StartFleet
from tests.harness import SCRIPTED_AGENT, FleetUnderTest, new_id

QUEUE = "shared-queue"
OWNER_KEY = f"_rollout_fleet.queue_owner.{QUEUE}"


def refusals_of_gateway_and_worker(redis_url: str, prefix: str, queue: str) -> list[str]:
    """What a gateway and a worker of key prefix ``prefix`` and queue ``queue`` said as they
    refused to start (exit 2, no traceback)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_FLEET_")}
    env |= {
        "REDIS_URL": redis_url,
        "AGENT": SCRIPTED_AGENT,
        "ROLLOUT_FLEET_KEY_PREFIX": prefix,
        "ROLLOUT_FLEET_QUEUE": queue,
    }
    outputs = []
    for command in ("gateway", "worker"):
        ports = ["--host", "127.0.0.1", "--port", str(free_port())] if command == "gateway" else []
        argv = fleet_command(command, *ports)
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        output = run.stdout + run.stderr
        assert run.returncode == 2, output
        assert "Traceback" not in output
        outputs.append(output)
    return outputs


def fleet_beside(fleet_b: FleetUnderTest, workers: int) -> LocalFleet:
    """Fleet A (key prefix ``fa``, queue ``qa``), started on fleet B's Redis database."""
    env = {"ROLLOUT_FLEET_KEY_PREFIX": "fa", "ROLLOUT_FLEET_QUEUE": "qa"}
    return LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=fleet_b.fleet.redis_url,
        workers=workers,
        env={**TEST_ENV, **env},
        log_dir=fleet_b.fleet.log_dir / "fleet-a",
    ).start()


def test_a_fleet_whose_queue_another_prefix_uses_refuses_to_start(start_fleet: StartFleet) -> None:
    first = start_fleet(
        workers=0, env={"ROLLOUT_FLEET_KEY_PREFIX": "fa", "ROLLOUT_FLEET_QUEUE": QUEUE}
    )
    for output in refusals_of_gateway_and_worker(first.fleet.redis_url, "fb", QUEUE):
        assert "used by the fleet with key prefix 'fa'" in output
        assert "ROLLOUT_FLEET_QUEUE" in output


def test_a_queue_named_among_another_fleets_keys_refuses_to_start(
    start_fleet: StartFleet,
) -> None:
    """A fleet whose queue lies in another fleet's key space (``fa:leases``), and one whose
    key prefix holds another fleet's queue: both refuse, naming the clash. Before: the first
    started, its admission made ``fa:leases`` a list, and fleet fa's claims failed halfway
    (WRONGTYPE), leaving a rollout running with no lease for good."""
    first = start_fleet(
        workers=0, env={"ROLLOUT_FLEET_KEY_PREFIX": "fa", "ROLLOUT_FLEET_QUEUE": QUEUE}
    )
    url = first.fleet.redis_url
    for output in refusals_of_gateway_and_worker(url, "fc", "fa:leases"):
        assert "lies among the keys of the fleet with key prefix 'fa'" in output
    second = start_fleet(
        workers=0, env={"ROLLOUT_FLEET_KEY_PREFIX": "fd", "ROLLOUT_FLEET_QUEUE": "fe:queue"}
    )
    for output in refusals_of_gateway_and_worker(second.fleet.redis_url, "fe", "fe-queue"):
        assert "uses the queue 'fe:queue', among this fleet's keys" in output
    assert first.redis.type("fa:leases") in ("zset", "none")


def test_a_worker_puts_back_another_fleets_message_and_ready_names_the_shared_queue(
    start_fleet: StartFleet,
) -> None:
    """Fleet B queues a rollout; its registration is then deleted (as if B were gone) and
    fleet A starts on the same queue. A's worker takes B's message, puts it back untouched
    and says so; B's ``/ready`` fails naming the shared queue; B's own worker then runs it."""
    fleet_b = start_fleet(
        workers=0, env={"ROLLOUT_FLEET_KEY_PREFIX": "fb", "ROLLOUT_FLEET_QUEUE": QUEUE}
    )
    rollout_id = new_id("fleet-b")
    assert fleet_b.init(fleet_b.body(rollout_id)).status_code == 202
    fleet_b.redis.delete(OWNER_KEY)
    fleet_a = LocalFleet(
        agent=SCRIPTED_AGENT,
        redis_url=fleet_b.fleet.redis_url,
        workers=1,
        env={**TEST_ENV, "ROLLOUT_FLEET_KEY_PREFIX": "fa", "ROLLOUT_FLEET_QUEUE": QUEUE},
        log_dir=fleet_b.fleet.log_dir / "fleet-a",
    ).start()
    try:
        worker = fleet_a.processes["worker-1"]
        wait_until(lambda: "put back another fleet's rollout" in worker.output(), 30, "put back")
        assert Keys("fb").record("v1", rollout_id) in worker.output()
        time.sleep(2)
        assert fleet_b.record(rollout_id)["status"] == "queued"
        assert fleet_b.redis.llen(QUEUE) == 1
        ready = fleet_b.http.get("/ready")
        assert ready.status_code == 503, ready.text
        assert "used by the fleet with key prefix 'fa'" in ready.json()["queue"]
    finally:
        fleet_a.stop()
    fleet_b.redis.delete(OWNER_KEY)  # A is gone: its registration goes too, as the fix says
    fleet_b.fleet.start_worker(1)
    (callback,) = fleet_b.wait_delivered([rollout_id])[rollout_id]
    assert callback["status"] == "COMPLETED"


def test_a_process_of_a_fleet_on_another_queue_refuses_to_start(start_fleet: StartFleet) -> None:
    """The same key prefix with another queue: its lost-message check would read its own
    empty queue, take the fleet's backlog for lost and resend it where another agent runs."""
    first = start_fleet(
        workers=0, env={"ROLLOUT_FLEET_KEY_PREFIX": "fq", "ROLLOUT_FLEET_QUEUE": QUEUE}
    )
    for output in refusals_of_gateway_and_worker(first.fleet.redis_url, "fq", "another-queue"):
        assert "the fleet with key prefix 'fq' uses the queue 'shared-queue'" in output
        assert "this process has 'another-queue'" in output
    assert first.redis.get("fq:queue") == QUEUE
    assert first.http.get("/ready").status_code == 200  # the fleet itself is untouched


def taken_and_lost(store: redis.Redis, queue: str, tag: str) -> None:
    """A worker takes the oldest message of ``queue`` (kombu records it as taken, a minute
    ago) and dies before starting its rollout."""
    message = store.rpop(queue)
    assert isinstance(message, str)
    store.hset(UNACKED, tag, json.dumps([json.loads(message), "", queue]))
    store.zadd(UNACKED_INDEX, {tag: time.time() - 60})


def test_a_sweeper_puts_back_its_own_fleets_taken_messages_and_leaves_another_fleets_alone(
    start_fleet: StartFleet,
) -> None:
    """Two fleets on one Redis database, with their own prefixes and queues, share kombu's
    taken set, and each has a message there that a worker of its own took and never started.
    Fleet A's sweeper puts A's back in A's queue (its rollout then runs: nothing else would
    put it back) and leaves B's alone: it must go back to B's queue, by B (which runs no
    worker here, so no sweeper). Before, fleet A's sweeper moved it into A's queue."""
    fleet_b = start_fleet(
        workers=0, env={"ROLLOUT_FLEET_KEY_PREFIX": "fb", "ROLLOUT_FLEET_QUEUE": "qb"}
    )
    in_b = new_id("fleet-b")
    assert fleet_b.init(fleet_b.body(in_b)).status_code == 202
    taken_and_lost(fleet_b.redis, "qb", "tag-b")
    fleet_a = fleet_beside(fleet_b, workers=0)
    try:
        in_a = new_id("fleet-a")
        admitted = httpx.post(
            f"{fleet_a.gateway_url}/v1/rollout/init", json=fleet_b.body(in_a), timeout=30
        )
        assert admitted.status_code == 202, admitted.text
        taken_and_lost(fleet_b.redis, "qa", "tag-a")
        fleet_a.start_worker(1)  # and with it, fleet A's sweeper
        (callback,) = fleet_b.wait_delivered([in_a], timeout=30)[in_a]
        assert callback["status"] == "COMPLETED"
        assert not fleet_b.redis.hexists(UNACKED, "tag-a")
        time.sleep(2 * float(TEST_ENV["ROLLOUT_FLEET_SWEEP_INTERVAL_SECONDS"]) + 1)  # more sweeps
        assert fleet_b.redis.hexists(UNACKED, "tag-b")
        assert fleet_b.record(in_b)["status"] == "queued"
        assert fleet_b.redis.llen("qa") == 0
    finally:
        fleet_a.stop()


CONTROL = """
import json, sys
from rollout_core.queue.celery_app import app
seen = sorted(app.control.inspect(timeout=3).ping() or {})
if sys.argv[1] == "shutdown":
    app.control.broadcast("shutdown")
print(json.dumps(seen))
"""


def control(env: dict[str, str], action: str) -> list[str]:
    """The workers a Celery client with ``env`` sees answer a ping (after a shutdown broadcast
    to every worker it can reach, with ``action`` "shutdown")."""
    argv = [sys.executable, "-c", CONTROL, action]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    seen: list[str] = json.loads(run.stdout)
    return seen


def test_fleets_sharing_a_redis_database_neither_see_nor_control_each_others_workers(
    start_fleet: StartFleet,
) -> None:
    """Celery remote control and events of two fleets on one Redis database (their own prefixes
    and queues) stay in each fleet: a ping sees its own workers only, and a shutdown broadcast
    to all reaches no other fleet's. Before: fleet A's client (and Flower) listed, revoked and
    shut down fleet B's workers."""
    fleet_b = start_fleet(
        workers=1, env={"ROLLOUT_FLEET_KEY_PREFIX": "fb", "ROLLOUT_FLEET_QUEUE": "qb"}
    )
    fleet_a = fleet_beside(fleet_b, workers=1)
    try:
        seen_by_b = control(fleet_b.fleet.process_env(), "ping")
        seen_by_a = control(fleet_a.process_env(), "shutdown")
        assert len(seen_by_a) == len(seen_by_b) == 1, (seen_by_a, seen_by_b)
        (worker_a,) = [p for name, p in fleet_a.processes.items() if "worker" in name]
        wait_until(lambda: not worker_a.alive(), 30, "fleet A's worker to obey its own shutdown")
        time.sleep(2)
        assert all(p.alive() for p in fleet_b.fleet.processes.values())
        assert control(fleet_b.fleet.process_env(), "ping") == seen_by_b
        in_b = new_id("fleet-b")
        assert fleet_b.init(fleet_b.body(in_b)).status_code == 202
        (callback,) = fleet_b.wait_delivered([in_b], timeout=30)[in_b]
        assert callback["status"] == "COMPLETED"
    finally:
        fleet_a.stop()
