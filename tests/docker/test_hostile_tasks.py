"""Hostile tasks: what a task declares never widens its sandbox.

One fleet (a gateway, one worker, Redis) runs a dataset of tasks written here as a hostile
task author would write them, on the engine ``scripts/docker-test-engine`` runs: compose files
asking for the host's network, the engine's socket, a host folder, privileges; a task whose
own network would reach the host; limits above the fleet's; rewards and logs too large to
read; a disk filled; a build that fails; a folder named in Cyrillic; tasks named outside the
tasks folder. Every rollout ends once, with the reason when it fails, the worker keeps serving
(same process, never recycled), and the engine keeps nothing of the fleet's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from bench.sandboxes import TASK_BASE, docker_host, write_oracle_rollout, write_task
from rollout_fleet.processes import free_port
from rollout_sdk.backend.harbor.engine import BUILT_LABEL
from tests.conftest import StartFleet
from tests.docker.sandboxes import ROLLOUT_LABEL, host_address, labelled, none_left
from tests.docker.test_sandboxes import fleet_label, listening, sandbox_env
from tests.harness import V2FleetUnderTest

MEMORY_MB, PIDS, CPUS = 512, 128, 0.5  # the fleet's ceilings in this module
VICTIM_VOLUME = "rollout-fleet-test-victim"  # another project's volume on the engine
CANARY = "canary-9d1f0c7e-not-for-any-sandbox"  # a secret in the workers' environment
OUTPUT_MB, DISK_MB = 32, 300

# A probe of the host's addresses from inside the sandbox: reward 1 when nothing answers.
PROBE_TEST = """\
#!/bin/bash
mkdir -p /logs/verifier
python3 - <<'EOF'
import socket
reached = []
for host, port in {targets!r}:
    try:
        with socket.create_connection((host, port), timeout=2):
            reached.append(f"{{host}}:{{port}}")
    except OSError:
        pass
print("reached:", reached)
open("/logs/verifier/reward.txt", "w").write("0" if reached else "1")
EOF
"""


def _compose(task: Path, document: dict[str, Any]) -> None:
    (task / "environment" / "docker-compose.yaml").write_text(json.dumps(document))


def _test(task: Path, script: str) -> None:
    test = task / "tests" / "test.sh"
    test.write_text(textwrap.dedent(script))
    test.chmod(0o755)


def _solve(task: Path, script: str) -> None:
    solve = task / "solution" / "solve.sh"
    solve.write_text(textwrap.dedent(script))
    solve.chmod(0o755)


# task name -> (what its compose file asks, the key the refusal must name)
ESCAPES: dict[str, tuple[dict[str, Any], str]] = {
    "host-network": ({"services": {"main": {"network_mode": "host"}}}, "network_mode"),
    "engine-socket": (
        {"services": {"main": {"volumes": ["/var/run/docker.sock:/var/run/docker.sock"]}}},
        "bind /var/run/docker.sock",
    ),
    "privileged": ({"services": {"main": {"privileged": True}}}, "privileged"),
    "capabilities": ({"services": {"main": {"cap_add": ["SYS_ADMIN"]}}}, "cap_add"),
    "host-pids": ({"services": {"main": {"pid": "host"}}}, "services.main.pid"),
    "devices": ({"services": {"main": {"devices": ["/dev/kmsg:/dev/kmsg"]}}}, "devices"),
    "published-port": ({"services": {"main": {"ports": ["16390:6379"]}}}, "ports"),
    "extra-hosts": ({"services": {"main": {"extra_hosts": ["gw:172.17.0.1"]}}}, "extra_hosts"),
    "host-user-namespace": ({"services": {"main": {"userns_mode": "host"}}}, "userns_mode"),
    "security-options": (
        {"services": {"main": {"security_opt": ["apparmor=unconfined"]}}},
        "security_opt",
    ),
    "volume-of-the-host": (
        {
            "services": {"main": {"volumes": ["root:/host"]}},
            "volumes": {"root": {"driver_opts": {"type": "none", "o": "bind", "device": "/"}}},
        },
        "volumes.root.driver_opts",
    ),
    "host-file-config": (
        {
            "services": {"main": {"configs": ["hostname"]}},
            "configs": {"hostname": {"file": "/etc/hostname"}},
        },
        "configs",
    ),
    "host-env-file": (
        {"services": {"main": {"env_file": ["/etc/hostname"]}}},
        "services.main.env_file names /etc/hostname, outside the task",
    ),
    "another-projects-volume": (
        {
            "services": {"main": {"volumes": ["victim:/victim"]}},
            "volumes": {"victim": {"name": VICTIM_VOLUME}},
        },
        f"volumes.victim.name={VICTIM_VOLUME}",
    ),
    "another-projects-network": (
        {"networks": {"default": {"name": "victim_default"}}},
        "networks.default.name=victim_default",
    ),
    "dockerfile-of-the-host": (
        {"services": {"spy": {"build": {"context": ".", "dockerfile": "/etc/hostname"}}}},
        "build.dockerfile /etc/hostname",
    ),
    "env-file-by-a-default": (
        {"services": {"main": {"env_file": ["${NOPE:-/etc/hostname}"]}}},
        "with a variable in it",
    ),
    "the-tasks-folders": (
        {"services": {"main": {"volumes": ["${CONTEXT_DIR}/../..:/trial"]}}},
        "bind mounts come only from the task's files",
    ),
    "a-sidecar-built-from-a-url": (
        {"services": {"spy": {"build": {"context": "./sidecar"}}}},
        "Dockerfile ADD http://169.254.169.254",
    ),
    "image-from-this-host": (
        {"services": {"spy": {"image": "127.0.0.1:16399/latest/meta-data:x"}}},
        "image 127.0.0.1:16399/latest/meta-data:x",
    ),
}


def write_tasks(root: Path, host_folder: Path, targets: list[tuple[str, int]]) -> Path:
    tasks = root / "tasks"
    write_task(tasks / "plain")
    for name, (document, _) in ESCAPES.items():
        _compose(write_task(tasks / name), document)
    write_fetching_tasks(tasks)
    return write_more_tasks(tasks, host_folder, targets)


def write_fetching_tasks(tasks: Path) -> None:
    """Dockerfiles that make the engine fetch from this host or the metadata address."""
    sidecar = tasks / "a-sidecar-built-from-a-url" / "environment" / "sidecar"
    sidecar.mkdir()
    (sidecar / "Dockerfile").write_text(
        f"FROM {TASK_BASE}\nADD http://169.254.169.254/latest/meta-data/iam /meta.txt\n"
    )
    for name, line in (
        ("add-from-metadata", "ADD http://169.254.169.254/latest/meta-data/iam /meta.txt"),
        ("base-from-this-host", "FROM 127.0.0.1:16398/base:latest"),
        ("copy-from-this-host", "COPY --from=127.0.0.1:16398/base:latest /etc/x /x"),
    ):
        task = write_task(tasks / name)
        (task / "environment" / "Dockerfile").write_text(f"FROM {TASK_BASE}\n{line}\n")


def write_more_tasks(tasks: Path, host_folder: Path, targets: list[tuple[str, int]]) -> Path:
    # Its own files, mounted: read-only, so no trial changes what the next one runs.
    own = write_task(tasks / "own-files-read-only")
    (own / "environment" / "data").mkdir()
    (own / "environment" / "data" / "answer.txt").write_text("42\n")
    _compose(own, {"services": {"main": {"volumes": ["./data:/data"]}}})
    _test(
        own,
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if echo 41 > /data/answer.txt 2>/dev/null; then echo 0; else cat /data/answer.txt | "
        "grep -q 42 && echo 1 || echo 0; fi > /logs/verifier/reward.txt\n",
    )
    # A host folder: its test writes there, which must never happen.
    mount = write_task(tasks / "host-folder")
    _compose(mount, {"services": {"main": {"volumes": [f"{host_folder}:/w"]}}})
    _test(mount, "#!/bin/bash\ntouch /w/written-by-a-task\necho 1 > /logs/verifier/reward.txt\n")
    # Its own network, joined by main: made internal, it reaches nothing.
    wide = write_task(tasks / "own-network")
    _compose(wide, {"services": {"main": {"networks": ["wide"]}}, "networks": {"wide": {}}})
    _test(wide, PROBE_TEST.format(targets=targets))
    # Limits above the fleet's ceiling, and below it.
    high = write_task(tasks / "high-limits", solve_seconds=12)
    _compose(
        high,
        {"services": {"main": {"mem_limit": "64g", "pids_limit": 100000, "cpus": 2}}},
    )
    low = write_task(tasks / "low-limits", solve_seconds=12)
    _compose(low, {"services": {"main": {"mem_limit": "256m", "pids_limit": 64}}})
    # What comes back out: a reward past its cap, logs past the trial's.
    big_reward = write_task(tasks / "big-reward")
    _test(
        big_reward,
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "head -c 200000 /dev/zero | tr '\\0' '1' > /logs/verifier/reward.txt\n",
    )
    big_logs = write_task(tasks / "big-logs")
    _test(
        big_logs,
        "#!/bin/bash\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n"
        f"head -c {3 * OUTPUT_MB}M /dev/zero > /logs/verifier/junk.bin\n",
    )
    # A disk filled past the trial's cap, slowly enough to be seen doing it.
    disk = write_task(tasks / "disk-fill")
    _solve(
        disk,
        "#!/bin/bash\nfor i in $(seq 1 40); do head -c 50M /dev/zero > /tmp/fill-$i; "
        "sleep 0.5; done\necho 42 > /app/answer.txt\n",
    )
    # A reward no float holds; a build that fails; a folder named in Cyrillic.
    huge = write_task(tasks / "huge-reward")
    _test(
        huge,
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'echo "{\\"reward\\": 1$(printf \'0%.0s\' $(seq 1 400))}" > /logs/verifier/reward.json\n',
    )
    # A build whose RUN tries this host's loopback, its address and the metadata address.
    probing = write_task(tasks / "build-probe")
    probe = PROBE_TEST.format(targets=[("127.0.0.1", targets[0][1]), *targets])
    script = probe.split("<<'EOF'\n", 1)[1].rsplit("EOF", 1)[0]
    script = script.replace("/logs/verifier/reward.txt", "/build-probe.txt")
    (probing / "environment" / "probe.py").write_text(script)
    (probing / "environment" / "Dockerfile").write_text(
        f"FROM {TASK_BASE}\nWORKDIR /app\nCOPY probe.py /probe.py\nRUN python3 /probe.py\n"
    )
    _test(
        probing,
        "#!/bin/bash\nmkdir -p /logs/verifier\ncp /build-probe.txt /logs/verifier/reward.txt\n",
    )
    # The workers' environment, asked for by the compose file and by task.toml.
    reading = write_task(tasks / "reads-the-workers-environment")
    _compose(reading, {"services": {"main": {"environment": {"LEAK": "${SANDBOX_TEST_CANARY}"}}}})
    _test(
        reading,
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'echo "{\\"reward\\": 1, \\"leak=$LEAK\\": 1, \\"ok\\": 2}" > /logs/verifier/reward.json\n',
    )
    toml = write_task(tasks / "toml-reads-the-workers-environment")
    (toml / "task.toml").write_text(
        'version = "1.0"\n[verifier.env]\nLEAK = "${SANDBOX_TEST_CANARY}"\n'
    )
    # A volume of its own filled past the trial's disk cap.
    filled = write_task(tasks / "volume-fill")
    _compose(
        filled,
        {"services": {"main": {"volumes": ["scratch:/scratch"]}}, "volumes": {"scratch": {}}},
    )
    _solve(
        filled,
        "#!/bin/bash\nfor i in $(seq 1 40); do head -c 50M /dev/zero > /scratch/fill-$i; "
        "sleep 0.5; done\necho 42 > /app/answer.txt\n",
    )
    # A sidecar that cannot start: what the engine says of it never reaches the trainer.
    missing = write_task(tasks / "missing-image")
    _compose(missing, {"services": {"spy": {"image": "no-such-image-marker-5e1a:1"}}})
    broken = write_task(tasks / "broken-build")
    (broken / "environment" / "Dockerfile").write_text(f"FROM {TASK_BASE}\nRUN false\n")
    write_task(tasks / "задача")
    return tasks


ROWS: dict[str, dict[str, str]] = {name: {"harbor_task_id": name} for name in ESCAPES} | {
    name: {"harbor_task_id": name}
    for name in (
        "plain",
        "host-folder",
        "own-network",
        "high-limits",
        "low-limits",
        "big-reward",
        "big-logs",
        "disk-fill",
        "huge-reward",
        "broken-build",
        "build-probe",
        "reads-the-workers-environment",
        "toml-reads-the-workers-environment",
        "volume-fill",
        "missing-image",
        "add-from-metadata",
        "base-from-this-host",
        "copy-from-this-host",
        "own-files-read-only",
        "задача",
    )
}


@pytest.fixture(scope="module")
def hostile(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("hostile")
    host_folder = tmp_path_factory.mktemp("host-folder")
    outside = write_task(tmp_path_factory.mktemp("outside") / "elsewhere")
    # A service on every address of this host, and one on the metadata address: the check
    # can fail (test_sandboxes.py shows an ordinary network reaching both).
    metadata = "169.254.169.254"
    added = subprocess.run(["ip", "addr", "add", f"{metadata}/32", "dev", "lo"], check=False)
    servers = [listening("0.0.0.0"), listening(metadata)]
    targets = [(host_address(), servers[0][1]), (metadata, servers[1][1])]
    tasks = write_tasks(root, host_folder, targets)
    main = root / "main.py"
    main.write_text(
        "from harbor.trial.queue import TrialQueue\n"
        "from osmosis_ai.rollout.backend.harbor import HarborBackend, TaskMode\n"
        f"backend = HarborBackend(orchestrator=TrialQueue(n_concurrent=4), "
        f"tasks_dir={str(tasks)!r}, task_mode=TaskMode.DATASET, agent='oracle')\n"
    )
    exited = {c.id for c in engine.containers.list(all=True, filters={"status": "exited"})}
    victim = engine.volumes.create(VICTIM_VOLUME)
    env = {
        "SANDBOX_TEST_CANARY": CANARY,
        **sandbox_env(engine, docker_config),
        "ROLLOUT_FLEET_SANDBOX_MEMORY_MB": str(MEMORY_MB),
        "ROLLOUT_FLEET_SANDBOX_PIDS": str(PIDS),
        "ROLLOUT_FLEET_SANDBOX_CPUS": str(CPUS),
        "ROLLOUT_FLEET_SANDBOX_OUTPUT_MB": str(OUTPUT_MB),
        "ROLLOUT_FLEET_SANDBOX_DISK_MB": str(DISK_MB),
    }
    fleet = start_fleet(str(main), handle=V2FleetUnderTest, workers=1, env=env)
    assert isinstance(fleet, V2FleetUnderTest)
    worker = fleet.fleet.processes["worker-1"]
    pid = worker.pid
    rows = {
        **ROWS,
        "outside-absolute": {"harbor_task": str(outside)},
        "outside-relative": {"harbor_task": "./../../" + str(outside.relative_to(outside.anchor))},
    }
    admitted = {name: fleet.admitted(metadata=metadata) for name, metadata in rows.items()}
    containers: dict[str, Any] = {}

    def read_limits() -> None:  # each limited container's settings, read while it runs
        ids = {name: admitted[name][0] for name in ("high-limits", "low-limits")}
        stop = time.monotonic() + 300
        while len(containers) < len(ids) and time.monotonic() < stop:
            for name, rollout_id in ids.items():
                found = engine.containers.list(filters={"label": f"{ROLLOUT_LABEL}={rollout_id}"})
                for container in found:
                    if container.labels.get("com.docker.compose.service") == "main":
                        containers.setdefault(name, container.attrs["HostConfig"])
            time.sleep(0.2)

    reader = threading.Thread(target=read_limits, daemon=True)
    reader.start()
    seen = {name: fleet.result(*ids, timeout=600) for name, ids in admitted.items()}
    reader.join(60)
    again = {name: fleet.poll(*admitted[name]).json() for name in admitted}
    yield {
        "fleet": fleet,
        "results": seen,
        "again": again,
        "admitted": admitted,
        "host_folder": host_folder,
        "worker": (pid, worker),
        "limits": containers,
        "exited_before": exited,
    }
    fleet.close()
    victim.remove(force=True)
    for server, _ in servers:
        server.terminate()
        server.wait(10)
    if added.returncode == 0:
        subprocess.run(["ip", "addr", "del", f"{metadata}/32", "dev", "lo"], check=False)


def failed_with(result: dict[str, Any], *parts: str) -> None:
    assert result["status"] == "failure", result
    assert result["err_category"] == "validation_error", result
    for part in parts:
        assert part in result["err_message"], (part, result["err_message"])
    assert "Traceback" not in result["err_message"]


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_a_compose_file_asking_for_the_host_is_refused_naming_the_key(
    hostile: dict[str, Any], name: str
) -> None:
    failed_with(hostile["results"][name], f"task {name}", ESCAPES[name][1])
    assert hostile["again"][name] == hostile["results"][name]  # one result, however often read


def test_a_host_folder_is_never_mounted(hostile: dict[str, Any]) -> None:
    failed_with(hostile["results"]["host-folder"], "task host-folder", "bind")
    assert not (hostile["host_folder"] / "written-by-a-task").exists()


def test_a_tasks_own_network_reaches_neither_the_host_nor_metadata(
    hostile: dict[str, Any],
) -> None:
    result = hostile["results"]["own-network"]
    assert result["status"] == "success", result
    assert result["sample"]["reward"] == 1.0, "the task's own network reached the host"


def test_every_container_runs_under_the_fleets_limits_or_the_tasks_lower_ones(
    hostile: dict[str, Any],
) -> None:
    high, low = hostile["limits"]["high-limits"], hostile["limits"]["low-limits"]
    assert high["Memory"] == MEMORY_MB * 2**20
    assert high["MemorySwap"] == high["Memory"]  # no swap beyond it
    assert high["PidsLimit"] == PIDS
    assert high["NanoCpus"] == int(CPUS * 1e9)
    assert "no-new-privileges:true" in (high["SecurityOpt"] or [])
    assert not high["Privileged"]
    assert low["Memory"] == 256 * 2**20
    assert low["PidsLimit"] == 64
    for name in ("high-limits", "low-limits"):
        assert hostile["results"][name]["status"] == "success", hostile["results"][name]


def test_a_reward_past_its_cap_fails_naming_the_file_and_the_cap(hostile: dict[str, Any]) -> None:
    failed_with(hostile["results"]["big-reward"], "reward.txt", "200000 bytes", "65536 bytes")


def test_logs_past_the_trials_output_cap_fail_naming_the_file(hostile: dict[str, Any]) -> None:
    failed_with(hostile["results"]["big-logs"], "junk.bin", f"{OUTPUT_MB} MB")


def test_a_disk_filled_past_its_cap_stops_the_trial(hostile: dict[str, Any]) -> None:
    failed_with(
        hostile["results"]["disk-fill"], f"{DISK_MB} MB cap", "ROLLOUT_FLEET_SANDBOX_DISK_MB"
    )


def test_a_reward_no_float_holds_is_the_tasks_fault(hostile: dict[str, Any]) -> None:
    failed_with(hostile["results"]["huge-reward"], "reward")


def test_a_task_whose_image_fails_to_build_fails_and_leaves_no_container(
    hostile: dict[str, Any], engine: docker.DockerClient
) -> None:
    failed_with(hostile["results"]["broken-build"], "did not build")
    exited = {c.id for c in engine.containers.list(all=True, filters={"status": "exited"})}
    assert exited <= hostile["exited_before"], "a failed build left its container"


def test_the_workers_environment_never_reaches_a_sandbox_nor_its_result(
    hostile: dict[str, Any],
) -> None:
    read = hostile["results"]["reads-the-workers-environment"]
    assert read["status"] == "success", read
    assert CANARY not in json.dumps(read)
    assert read["sample"]["metrics"]["reward_ok"] == 2.0  # plain reward names pass
    assert not any("leak" in name for name in read["sample"]["metrics"])  # others do not
    failed_with(
        hostile["results"]["toml-reads-the-workers-environment"],
        "task.toml verifier env LEAK reads the worker's environment",
    )
    records = json.dumps([hostile["fleet"].record(i) for i, _ in hostile["admitted"].values()])
    assert CANARY not in records


@pytest.mark.parametrize(
    ("name", "instruction"),
    [
        ("add-from-metadata", "Dockerfile ADD http://169.254.169.254"),
        ("base-from-this-host", "Dockerfile FROM"),
        ("copy-from-this-host", "Dockerfile COPY --from=127.0.0.1:16398/base:latest"),
    ],
)
def test_a_dockerfile_making_the_engine_fetch_from_this_host_is_refused(
    hostile: dict[str, Any], name: str, instruction: str
) -> None:
    failed_with(hostile["results"][name], f"task {name}", instruction)


def test_a_tasks_own_files_are_mounted_read_only(hostile: dict[str, Any]) -> None:
    result = hostile["results"]["own-files-read-only"]
    assert result["status"] == "success", result
    assert result["sample"]["reward"] == 1.0, "the sandbox wrote to the task's own files"


def test_another_projects_volume_survives_a_task_naming_it(
    hostile: dict[str, Any], engine: docker.DockerClient
) -> None:
    assert engine.volumes.get(VICTIM_VOLUME).name == VICTIM_VOLUME


def test_a_volume_filled_past_the_disk_cap_stops_the_trial(hostile: dict[str, Any]) -> None:
    failed_with(hostile["results"]["volume-fill"], f"{DISK_MB} MB cap")


def test_what_the_engine_says_of_a_sandbox_never_reaches_the_trainer(
    hostile: dict[str, Any],
) -> None:
    result = hostile["results"]["missing-image"]
    assert result["status"] == "failure", result
    assert "docker compose up failed (return code" in result["err_message"], result
    assert "marker" not in result["err_message"]
    assert "/" not in result["err_message"].split("failed", 1)[1]  # no paths, no command


def test_a_build_reaches_neither_this_host_nor_metadata(hostile: dict[str, Any]) -> None:
    result = hostile["results"]["build-probe"]
    assert result["status"] == "success", result
    assert result["sample"]["reward"] == 1.0, "the build's RUN reached this host"


def test_a_folder_named_in_another_script_runs(hostile: dict[str, Any]) -> None:
    result = hostile["results"]["задача"]
    assert result["status"] == "success", result
    assert result["sample"]["reward"] == 1.0


def test_a_task_outside_the_tasks_folder_is_refused(hostile: dict[str, Any]) -> None:
    for name in ("outside-absolute", "outside-relative"):
        failed_with(hostile["results"][name], "outside tasks_dir")


def test_the_worker_served_every_hostile_task_without_a_restart(
    hostile: dict[str, Any], engine: docker.DockerClient
) -> None:
    pid, worker = hostile["worker"]
    assert worker.pid == pid, "the worker was recycled"
    assert worker.alive(), "the worker is gone"
    logs = hostile["fleet"].logs(200000)
    assert "blocking call" not in logs
    assert hostile["results"]["plain"]["status"] == "success"
    none_left(engine, fleet_label(hostile["fleet"]), within=10)
    assert not labelled(engine, fleet_label(hostile["fleet"]))["containers"]


@pytest.mark.parametrize("command", ["worker", "up"])
@pytest.mark.parametrize("missing", ["compose-plugin", "engine"])
def test_a_sandboxed_agent_refuses_to_start_without_what_runs_its_sandboxes(
    tmp_path: Path, docker_config: Path, command: str, missing: str
) -> None:
    """Before: the fleet reported ready and every rollout failed `unknown flag: --project-name`
    (no compose plugin), or waited on an engine that was not there."""
    main = write_oracle_rollout(tmp_path / "oracle")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_FLEET_", "REDIS"))}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    env["DOCKER_HOST"] = docker_host()
    env["DOCKER_CONFIG"] = str(docker_config)
    if missing == "compose-plugin":
        env["DOCKER_CONFIG"] = str(tmp_path / "empty-docker-config")
    else:
        env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"
    argv = [sys.executable, "-m", "rollout_fleet", command]
    if command == "worker":
        env["ROLLOUT_FLEET_AGENT"] = str(main)
        env["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # not reached: refused first
    else:
        argv += ["--agent", str(main), "--no-flower", "--port", str(free_port())]
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    expected = "has no compose plugin" if missing == "compose-plugin" else "does not answer"
    assert lines[0].startswith("the agent runs rollouts in sandboxes, and "), lines[0]
    assert expected in lines[0]
    assert "Traceback" not in done.stderr


BUILD_PROBE = """\
import json, os, socket, urllib.error, urllib.request
host, served, metadata, answering = {args!r}
def connects(address, port):
    try:
        with socket.create_connection((address, port), timeout=3):
            return True
    except OSError:
        return False
def fetched(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return str(error)[:80]
seen = {{
    "proxy": bool(os.environ.get("http_proxy")),
    "direct to this host": connects(host, served),
    "direct to metadata": connects(metadata, answering),
    "mirror": fetched(f"http://{{host}}:{{served}}/"),
    "loopback": fetched(f"http://127.0.0.1:{{served}}/"),
    "metadata": fetched(f"http://{{metadata}}:{{answering}}/"),
}}
print(seen)
json.dump(seen, open("/build-probe.json", "w"))
"""


def test_a_proxied_build_fetches_from_the_internet_and_listed_hosts_only(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK=proxied: a build's RUN reaches a package mirror the
    operator listed through the fleet's proxy, and neither this host's loopback nor the
    metadata address, directly or through the proxy."""
    metadata = "169.254.169.254"
    added = subprocess.run(["ip", "addr", "add", f"{metadata}/32", "dev", "lo"], check=False)
    mirror, served = listening("0.0.0.0")
    answering, answering_port = listening(metadata)
    host = host_address()
    root = tmp_path_factory.mktemp("proxied")
    task = write_task(root / "proxied-build")
    (task / "environment" / "probe.py").write_text(
        BUILD_PROBE.format(args=(host, served, metadata, answering_port))
    )
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {TASK_BASE}\nWORKDIR /app\nCOPY probe.py /probe.py\nRUN python3 /probe.py\n"
    )
    expected = {
        "proxy": True,
        "direct to this host": False,
        "direct to metadata": False,
        "mirror": 200,
        "loopback": 403,
        "metadata": 403,
    }
    _test(
        task,
        "#!/bin/bash\nmkdir -p /logs/verifier\npython3 - <<'EOF'\nimport json\n"
        f"seen = json.load(open('/build-probe.json'))\nexpected = {expected!r}\n"
        "open('/logs/verifier/reward.txt', 'w').write('1' if seen == expected else '0')\n"
        "print(seen)\nEOF\n",
    )
    main = root / "main.py"
    main.write_text(
        "from osmosis_ai.rollout.backend.harbor import HarborBackend\n"
        f"backend = HarborBackend(tasks_dir={str(task)!r}, agent='oracle')\n"
    )
    env = {
        **sandbox_env(engine, docker_config),
        "ROLLOUT_FLEET_SANDBOX_BUILD_NETWORK": "proxied",
        "ROLLOUT_FLEET_SANDBOX_BUILD_HOSTS": host,
    }
    fleet = start_fleet(str(main), handle=V2FleetUnderTest, workers=1, env=env)
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        result = fleet.result(*fleet.admitted(), timeout=300)
        assert result["status"] == "success", f"{result}\n{fleet.logs(20000)}"
        assert result["sample"]["reward"] == 1.0, fleet.logs(20000)
        left = engine.containers.list(all=True, filters={"label": f"{BUILT_LABEL}=proxy"})
        assert not left, "the build's proxy was left"
        assert not engine.networks.list(filters={"label": f"{BUILT_LABEL}=proxy"})
    finally:
        fleet.close()
        for server in (mirror, answering):
            server.terminate()
            server.wait(10)
        if added.returncode == 0:
            subprocess.run(["ip", "addr", "del", f"{metadata}/32", "dev", "lo"], check=False)
