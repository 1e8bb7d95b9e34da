"""Long-polls survive a gateway's death (the poller carries on at the other
replica), and a Celery revoke — what Flower's Revoke button sends — cancels exactly that
rollout's task, on v2 and v1 fleets, without touching the worker process or its neighbours."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from celery import Celery

from tests.conftest import module_fleet, v2_fleet
from tests.harness import LEASE_HEADER, TERMINAL, FleetUnderTest, V2FleetUnderTest, script

replicas = v2_fleet(env={"ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "30"})
v1_fleet = module_fleet(workers=1)


def poll_with_failover(urls: list[str], rollout_id: str, token: str, out: dict[str, Any]) -> None:
    """A trainer behind a load balancer: on a dead gateway, go on at the next one."""
    for url in urls:
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                while True:
                    body = client.get(
                        f"/rollout/{rollout_id}/result", headers={LEASE_HEADER: token}
                    ).json()
                    if body["status"] in TERMINAL:
                        out[rollout_id] = (url, body)
                        return
        except httpx.TransportError:
            continue


def test_long_polls_outlive_the_gateway_they_were_on(replicas: V2FleetUnderTest) -> None:
    first, second = replicas.fleet.gateway_urls
    admitted = [replicas.admitted(metadata={"script": [{"sleep": 4}]}) for _ in range(10)]
    results: dict[str, Any] = {}
    pollers = [
        threading.Thread(target=poll_with_failover, args=([first, second], rid, token, results))
        for rid, token in admitted
    ]
    for poller in pollers:
        poller.start()
    time.sleep(1.5)  # every poller is now waiting on the first gateway
    replicas.fleet.processes["gateway"].kill()
    for poller in pollers:
        poller.join(60)
    try:
        assert len(results) == 10
        for url, body in results.values():
            assert url == second
            assert body["status"] == "success"
            assert body["sample"]["reward"] == 1.0
    finally:
        replicas.fleet.start_gateway(index=1)
        replicas.fleet.wait_ready(60)


def revoke(fleet: FleetUnderTest, record: str) -> None:
    app = Celery(broker=fleet.fleet.redis_url)
    try:
        app.control.revoke(fleet.redis.hget(record, "task"))
    finally:
        app.close()


def test_a_revoke_cancels_one_v2_rollout_only(replicas: V2FleetUnderTest) -> None:
    workers = {n: p.pid for n, p in replicas.fleet.processes.items() if n.startswith("worker")}
    neighbours = [replicas.admitted(metadata={"script": [{"chats": [5, 0.3]}]}) for _ in range(4)]
    victim, token = replicas.admitted(metadata={"script": [{"chats": [60, 0.2]}]})
    replicas.wait_status(victim, {"running"})
    revoke(replicas, replicas.record_key(victim))
    final = replicas.result(victim, token)
    assert (final["status"], final["err_message"]) == ("cancelled", "cancelled")
    for rollout_id, neighbour_token in neighbours:
        assert replicas.result(rollout_id, neighbour_token)["status"] == "success"
    assert {n: replicas.fleet.processes[n].pid for n in workers} == workers
    assert all(replicas.fleet.processes[n].alive() for n in workers)


def test_a_revoked_v1_rollout_still_reports_back_once(v1_fleet: FleetUnderTest) -> None:
    body = v1_fleet.body(metadata=script({"chat": {}}, {"sleep": 30}, {"complete": {}}))
    assert v1_fleet.init(body).status_code == 202
    v1_fleet.wait_status(body["rollout_id"], {"running"})
    revoke(v1_fleet, v1_fleet.record_key(body["rollout_id"]))
    (delivered,) = v1_fleet.wait_delivered([body["rollout_id"]], timeout=20)[body["rollout_id"]]
    assert delivered["status"] == "ERROR"
    assert "cancelled" in delivered["error_message"]
    assert v1_fleet.wait_status(body["rollout_id"], {"failure"})["delivery"] == "delivered"


narrow_v2 = v2_fleet(gateways=1, workers=1, concurrency=1)
narrow_v1 = module_fleet(workers=1, concurrency=1)


def test_revoking_a_queued_v2_rollout_cancels_it(narrow_v2: V2FleetUnderTest) -> None:
    busy = narrow_v2.admitted(metadata={"script": [{"sleep": 2}]})
    narrow_v2.wait_status(busy[0], {"running"})
    queued, token = narrow_v2.admitted()
    revoke(narrow_v2, narrow_v2.record_key(queued))
    final = narrow_v2.result(queued, token)
    assert final["status"] == "cancelled"
    assert narrow_v2.trainer.calls("chat", queued) == []


def test_revoking_a_queued_v1_rollout_reports_back_once(narrow_v1: FleetUnderTest) -> None:
    busy = narrow_v1.body(metadata=script({"sleep": 2}, {"complete": {}}))
    queued = narrow_v1.body()
    assert narrow_v1.init(busy).status_code == narrow_v1.init(queued).status_code == 202
    revoke(narrow_v1, narrow_v1.record_key(queued["rollout_id"]))
    deliveries = narrow_v1.wait_delivered([busy["rollout_id"], queued["rollout_id"]])
    (reported,) = deliveries[queued["rollout_id"]]
    assert reported["status"] == "ERROR"
    assert "cancelled" in reported["error_message"]
    assert narrow_v1.trainer.calls("chat", queued["rollout_id"]) == []
