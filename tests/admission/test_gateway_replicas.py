"""The gateway keeps no state of its own — two gateway processes behind one
port behave as one, including for concurrent duplicate admissions."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.conftest import module_fleet
from tests.harness import FleetUnderTest, script

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
