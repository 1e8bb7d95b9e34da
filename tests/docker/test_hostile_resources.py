"""Tasks that try to take the host down, two at a time beside a running fleet.

A fork bomb, a 4 GB memory balloon, a 5 GB disk write and 1 GB of output, each a task of one
dataset, run two at a time while well-behaved rollouts go on beside them. Every hostile rollout
ends once, with the reason; the workers, Redis and the gateway keep serving the others, whose
p99 stays within 2x of the same rollouts run before the hostile ones, measured in this run; no
worker restarts; nothing of the fleet's is left on the engine.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from bench.sandboxes import write_task
from tests.conftest import StartFleet
from tests.docker.sandboxes import labelled, none_left
from tests.docker.test_sandboxes import fleet_label, sandbox_env
from tests.harness import V2FleetUnderTest

SETTINGS = {  # an operator's sizing for this 2-core, 24 GB host
    "ROLLOUT_FLEET_SANDBOX_MEMORY_MB": "512",
    "ROLLOUT_FLEET_SANDBOX_PIDS": "256",
    "ROLLOUT_FLEET_SANDBOX_CPUS": "0.5",
    "ROLLOUT_FLEET_SANDBOX_DISK_MB": "1024",
    "ROLLOUT_FLEET_SANDBOX_OUTPUT_MB": "64",
}
# Each writes the right answer only if its hostile part finished.
SOLUTIONS = {
    "fork-bomb": "bomb() { bomb | bomb & }; bomb\nsleep 600",
    "memory-balloon": "python3 -c 'b = bytearray(4 * 2**30); b[::4096] = bytes(len(b[::4096]))'",
    "disk-write": "head -c 5G /dev/zero > /tmp/fill",
    "output": "head -c 1G /dev/zero | tr '\\0' 'y'",
}
CONTROLS = 16  # well-behaved rollouts per phase, four at a time
WAVE = 4


def write_tasks(tasks: Path) -> None:
    write_task(tasks / "plain")
    for name, script in SOLUTIONS.items():
        task = write_task(tasks / name)
        # A fork bomb never finishes: its agent's time limit ends it.
        (task / "task.toml").write_text(
            'version = "1.0"\n[agent]\ntimeout_sec = 25.0\n[verifier]\ntimeout_sec = 30.0\n'
        )
        solve = task / "solution" / "solve.sh"
        solve.write_text(f"#!/bin/bash\n{script} && echo 42 > /app/answer.txt\n")


def controls(fleet: V2FleetUnderTest, count: int) -> list[float]:
    """Seconds from admission to result of ``count`` plain rollouts, ``WAVE`` at a time."""
    took: list[float] = []
    while len(took) < count:
        started = time.monotonic()
        wave = [fleet.admitted(metadata={"harbor_task_id": "plain"}) for _ in range(WAVE)]
        for ids in wave:
            result = fleet.result(*ids, timeout=300)
            assert result["status"] == "success", result
            assert result["sample"]["reward"] == 1.0
            took.append(time.monotonic() - started)
    return took


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def test_hostile_tasks_two_at_a_time_leave_the_fleet_serving(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("resources")
    write_tasks(root / "tasks")
    main = root / "main.py"
    main.write_text(
        "from harbor.trial.queue import TrialQueue\n"
        "from osmosis_ai.rollout.backend.harbor import HarborBackend, TaskMode\n"
        f"backend = HarborBackend(orchestrator=TrialQueue(n_concurrent=4), "
        f"tasks_dir={str(root / 'tasks')!r}, task_mode=TaskMode.DATASET, agent='oracle')\n"
    )
    env = {**sandbox_env(engine, docker_config), **SETTINGS}
    fleet = start_fleet(str(main), handle=V2FleetUnderTest, workers=2, env=env)
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        pids = {name: p.pid for name, p in fleet.fleet.processes.items()}
        controls(fleet, WAVE)  # images built, caches warm
        before = controls(fleet, CONTROLS)

        hostile: dict[str, dict[str, Any]] = {}

        def run_hostile() -> None:
            names = list(SOLUTIONS)
            for pair in (names[:2], names[2:]):
                admitted = {n: fleet.admitted(metadata={"harbor_task_id": n}) for n in pair}
                for name, ids in admitted.items():
                    hostile[name] = {"ids": ids, "result": fleet.result(*ids, timeout=300)}

        runner = threading.Thread(target=run_hostile)
        runner.start()
        during: list[float] = []
        while runner.is_alive() or len(during) < CONTROLS:
            during += controls(fleet, WAVE)
        runner.join()

        for name, ran in hostile.items():  # each ended once, saying why
            result = ran["result"]
            assert fleet.poll(*ran["ids"]).json() == result, name
            print(
                f"{name}: {result['status']} {result.get('err_category')} "
                f"{(result.get('err_message') or '')[:160]}"
            )
        assert hostile["fork-bomb"]["result"]["status"] == "failure"
        assert hostile["fork-bomb"]["result"]["err_category"] == "timeout"
        balloon = hostile["memory-balloon"]["result"]  # killed in its own cgroup: no answer
        assert balloon["status"] == "success", balloon
        assert balloon["sample"]["reward"] == 0.0
        disk = hostile["disk-write"]["result"]
        assert disk["status"] == "failure", disk
        assert "1024 MB cap" in disk["err_message"]
        output = hostile["output"]["result"]
        assert output["status"] == "failure", output
        assert "oracle.txt" in output["err_message"]
        assert "64 MB" in output["err_message"]

        ratio = p99(during) / p99(before)
        print(
            f"plain rollouts: p99 {p99(before):.1f}s before, {p99(during):.1f}s beside the "
            f"hostile tasks ({len(during)} rollouts; x{ratio:.2f}); median "
            f"{statistics.median(before):.1f}s / {statistics.median(during):.1f}s"
        )
        assert ratio <= 2.0, (before, during)
        now = {name: p.pid for name, p in fleet.fleet.processes.items()}
        assert now == pids, "a process was restarted"
        assert all(p.alive() for p in fleet.fleet.processes.values())
        assert "blocking call" not in fleet.logs(200000)
        none_left(engine, fleet_label(fleet), within=15)
        assert not labelled(engine, fleet_label(fleet))["volumes"]
    finally:
        fleet.close()
