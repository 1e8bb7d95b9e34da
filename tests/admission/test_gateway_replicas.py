"""The gateway keeps no state of its own — two gateway processes behind one
port behave as one, including for concurrent duplicate admissions; and long-polls survive a
gateway's death (the poller carries on at the other replica)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import module_fleet, v2_fleet
from tests.harness import LEASE_HEADER, TERMINAL, FleetUnderTest, V2FleetUnderTest, script

replicated = module_fleet(workers=1, gateway_workers=2)


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_two_gateway_processes_serve_the_port(replicated: FleetUnderTest) -> None:
    supervisor = replicated.fleet.processes["gateway"].pid
    assert len([p for p in children(supervisor) if Path(f"/proc/{p}/cmdline").exists()]) >= 2


def test_concurrent_duplicates_across_replicas_run_once(replicated: FleetUnderTest) -> None:
    bodies = [
        replicated.body(metadata=script({"chat": {}}, {"sleep": 0.3}, {"complete": {}}))
        for _ in range(20)
    ]

    def admit(body: dict[str, object]) -> httpx.Response:
        # A fresh connection per request, so the kernel spreads them over both processes.
        with httpx.Client(base_url=replicated.fleet.gateway_url, timeout=30) as client:
            return client.post("/v1/rollout/init", json=body)

    with ThreadPoolExecutor(40) as pool:
        responses = list(pool.map(admit, [body for body in bodies for _ in range(10)]))
    assert {r.status_code for r in responses} == {202}
    for index, body in enumerate(bodies):
        mine = responses[index * 10 : index * 10 + 10]
        assert len({r.content for r in mine}) == 1
        assert mine[0].json()["rollout_id"] == body["rollout_id"]

    ids = [b["rollout_id"] for b in bodies]
    deliveries = replicated.wait_delivered(ids)
    for rollout_id in ids:
        replicated.wait_status(rollout_id, {"success"})
        assert len(deliveries[rollout_id]) == 1
        assert len(replicated.trainer.calls("chat", rollout_id)) == 1
        assert replicated.record(rollout_id)["attempt"] == "1"


replicas = v2_fleet(env={"ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "30"})


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
