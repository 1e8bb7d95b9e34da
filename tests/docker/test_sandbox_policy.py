"""The sandbox policy over task definitions drawn by Hypothesis.

Each example is a task's ``environment/docker-compose.yaml`` (services with keys both allowed
and forbidden, values that reach out or stay in, networks, volumes, bind mounts inside and
outside the task, limits above and below the fleet's), rendered by the real ``docker compose
config`` with Harbor's own prebuilt file and the fleet's overlay, as a trial renders it. The
confined model must never hold a forbidden key, a bind from outside the trial, a network with
a way out, or a limit above the fleet's; and a forbidden key must refuse the trial. The checker
is shown able to fail: with ``privileged`` allowed it reports the model.

A sample of drawn tasks then runs on the engine through a fleet: each rollout ends once
(success, or a validation_error naming the key), and nothing of the fleet's is left.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest
from harbor.environments.docker import COMPOSE_PREBUILT_PATH
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.sandboxes import write_task
from rollout_sdk.backend.harbor.environment import engine_environment
from rollout_sdk.backend.harbor.policy import (
    NO_NEW_PRIVILEGES,
    RELAY_KEYS,
    SERVICE_KEYS,
    Limits,
    PolicyRefusal,
    SandboxPolicy,
    confine,
)
from tests.conftest import StartFleet
from tests.docker.sandboxes import labelled, none_left
from tests.docker.test_sandboxes import fleet_label, sandbox_env
from tests.harness import V2FleetUnderTest

HARBOR_PREBUILT = COMPOSE_PREBUILT_PATH  # Harbor's own file for a task with an image
LIMITS = Limits(memory_mb=512, pids=128, cpus=0.5)
LABELS = {"org.rollout-fleet.execution": "drawn"}
RELAY, RELAY_IMAGE = "rollout-egress", "rollout-fleet-sandbox-relay:drawn"
CANARY = "canary-31c5-in-the-workers-environment"
# The fleet's own overlay as a trial with a relay has it (egress.overlay, sandbox.write_overlay).
OVERLAY = {
    "services": {
        "main": {"labels": LABELS},
        RELAY: {
            "image": RELAY_IMAGE,
            "command": ["python3", "/relay.py", "9001", "10.1.2.3", "9001"],
            "init": True,
            "networks": {"default": {"aliases": ["traingate"]}, "egress": {}},
        },
    },
    "networks": {"default": {"internal": True}, "egress": {}},
}

# Forbidden service keys, each with a value Compose renders.
FORBIDDEN: dict[str, list[Any]] = {
    "network_mode": ["host", "none", "bridge"],
    "privileged": [True],
    "pid": ["host"],
    "ipc": ["host"],
    "cap_add": [["SYS_ADMIN"], ["NET_ADMIN"]],
    "devices": [["/dev/kmsg:/dev/kmsg"]],
    "security_opt": [["seccomp=unconfined"]],
    "userns_mode": ["host"],
    "ports": [["16391:80"], ["127.0.0.1:16392:80"]],
    "extra_hosts": [["gw:10.0.0.1"]],
    "dns": [["8.8.8.8"]],
    "sysctls": [{"net.ipv4.ip_forward": "1"}],
    "ulimits": [{"nproc": 65535}],
    "cgroup_parent": ["/"],
    "group_add": ["0"],
    "runtime": ["runc"],
    "oom_score_adj": [-1000],
    "container_name": ["fixed-name"],
    "logging": [{"driver": "syslog"}],
    "volumes_from": [["other"]],
}
ALLOWED: dict[str, list[Any]] = {
    "environment": [{"A": "1"}, ["B=2"]],
    "working_dir": ["/app", "/tmp"],
    "user": ["root", "1000"],
    "hostname": ["box"],
    "init": [True, False],
    "tty": [True],
    "read_only": [False],
    "cap_drop": [["NET_RAW"]],
    "mem_limit": ["64g", "128m", "1g"],
    "cpus": [0.25, 4, 64],
    "pids_limit": [16, 100000],
    "shm_size": ["2g", "64m"],
    "stop_signal": ["SIGKILL"],
    "expose": [["80"]],
    "restart": ["no"],
    "labels": [{"org.rollout-fleet.execution": "forged"}, {"x": "y"}],
    # Values that reach out: the workers' environment, a registry on this host.
    "environment_": [{"LEAK": "${SANDBOX_TEST_CANARY}"}, ["LEAK=${SANDBOX_TEST_CANARY:-x}"]],
    "image": [
        "python:3.12-slim-bookworm",
        "127.0.0.1:16399/meta-data:x",
        "localhost/x:1",
        "registry.example.com/x:1",
    ],
    "build": [
        {"context": ".", "dockerfile": "/etc/hostname"},
        {"context": ".", "dockerfile": "../../../../etc/hostname"},
        {"context": "."},
    ],
}


def mounts(task: Path) -> st.SearchStrategy[str]:
    inside = str(task / "environment" / "data")
    return st.sampled_from(
        [
            f"{inside}:/data",
            "./data:/data:ro",
            "/:/host",
            "/var/run/docker.sock:/var/run/docker.sock",
            "../../..:/up",
            "named:/named",
            f"{task}/environment/link-out:/escape",
        ]
    )


@st.composite
def compose_files(draw: st.DrawFn, task: Path) -> dict[str, Any]:
    main: dict[str, Any] = {}
    for key in draw(st.sets(st.sampled_from(sorted(ALLOWED)), max_size=5)):
        main[key.rstrip("_")] = draw(st.sampled_from(ALLOWED[key]))
    for key in draw(st.sets(st.sampled_from(sorted(FORBIDDEN)), max_size=2)):
        main[key] = draw(st.sampled_from(FORBIDDEN[key]))
    if "volumes_from" in main:
        main.pop("volumes_from")
        main["volumes_from"] = ["helper"]
    document: dict[str, Any] = {"services": {"main": main}}
    if draw(st.booleans()):
        main["volumes"] = draw(st.lists(mounts(task), max_size=2, unique=True))
        if any(m.startswith("named:") for m in main["volumes"]):
            bound = draw(st.booleans())
            opts = {"driver_opts": {"type": "none", "o": "bind", "device": "/"}} if bound else {}
            document["volumes"] = {"named": opts}
    if draw(st.booleans()) or "volumes_from" in main:
        document["services"]["helper"] = {"image": "python:3.12-slim-bookworm"}
        if draw(st.booleans()):
            document["services"]["helper"]["network_mode"] = "host"
    if draw(st.booleans()):
        name = draw(st.sampled_from(["wide", "egress", "default"]))
        main["networks"] = [name]
        document["networks"] = {
            name: draw(
                st.sampled_from(
                    [{}, {"external": True}, {"name": "victim_default"}, {"name": "host"}]
                )
            )
        }
    if draw(st.booleans()):  # a service named like the fleet's relay
        document["services"][RELAY] = draw(
            st.sampled_from(
                [
                    {"entrypoint": ["python3", "-c", "print(1)"]},
                    {"volumes": ["/:/host"]},
                    {"environment": {"A": "1"}},
                    {"image": "python:3.12-slim-bookworm"},
                ]
            )
        )
    if "volumes" in document and draw(st.booleans()):
        document["volumes"]["named"] = {"name": "rollout-fleet_redis-data"}
    if draw(st.booleans()):
        main["deploy"] = {"resources": {"limits": {"memory": "8g", "cpus": "8"}}}
        main.pop("mem_limit", None)
        main.pop("cpus", None)
    return document


def render(task: Path, document: dict[str, Any], config: Path) -> dict[str, Any] | None:
    """What Compose renders for a trial of this task (None: Compose refuses the file)."""
    environment = task / "environment"
    (environment / "docker-compose.yaml").write_text(json.dumps(document))
    (task / "overlay.json").write_text(json.dumps(OVERLAY))
    # As the fleet runs compose: the workers' environment (with a secret in it) scrubbed.
    workers = {**os.environ, "DOCKER_CONFIG": str(config), "SANDBOX_TEST_CANARY": CANARY}
    env = {**engine_environment(workers), "PREBUILT_IMAGE_NAME": "task:drawn"}
    argv = ["docker", "compose", "-p", "drawn", "--project-directory", str(environment)]
    for path in (HARBOR_PREBUILT, environment / "docker-compose.yaml", task / "overlay.json"):
        argv += ["-f", str(path)]
    done = subprocess.run(
        [*argv, "config", "--format", "json"], env=env, capture_output=True, timeout=60, check=False
    )
    if done.returncode != 0:
        return None
    rendered: dict[str, Any] = json.loads(done.stdout)
    return rendered


def violations(model: dict[str, Any], policy: SandboxPolicy) -> list[str]:
    """What in a confined model no sandbox may hold (empty: none)."""
    found = [key for key in model if key not in ("name", "services", "networks", "volumes")]
    if CANARY in json.dumps(model):
        found.append("the workers' environment")
    for section in ("networks", "volumes"):
        for key, body in (model.get(section) or {}).items():
            if body.get("name") not in (None, f"{model.get('name')}_{key}"):
                found.append(f"{section}.{key}.name={body.get('name')}")
    for name, service in model["services"].items():
        found += service_violations(name, service, policy)
    for name, network in model["networks"].items():
        if network.get("external"):
            found.append(f"networks.{name} is the engine's")
        if not network.get("internal") and name not in policy.open_networks:
            found.append(f"networks.{name} has a way out")
    for name, volume in (model.get("volumes") or {}).items():
        if volume.get("driver_opts"):
            found.append(f"volumes.{name}.driver_opts")
    return found


def service_violations(name: str, service: dict[str, Any], policy: SandboxPolicy) -> list[str]:
    found = [f"{name}.{key}" for key in service if key not in SERVICE_KEYS | {"security_opt"}]
    found += reach_violations(name, service, policy)
    if service.get("security_opt") != [NO_NEW_PRIVILEGES]:
        found.append(f"{name}.security_opt={service.get('security_opt')}")
    if int(service["mem_limit"]) > policy.limits.memory_mb * 2**20:
        found.append(f"{name}.mem_limit")
    if service["memswap_limit"] != service["mem_limit"]:
        found.append(f"{name}.memswap_limit")
    if service["pids_limit"] > policy.limits.pids or service["cpus"] > policy.limits.cpus:
        found.append(f"{name}.pids_limit/cpus")
    for mount in service.get("volumes") or []:
        source = os.path.realpath(str(mount.get("source") or ""))
        inside = any(source == r or source.startswith(r + "/") for r in policy.mount_roots)
        if mount["type"] == "bind" and not inside:
            found.append(f"{name}.volumes bind {source}")
    if service["labels"].get("org.rollout-fleet.execution") != "drawn":
        found.append(f"{name}.labels")
    return found


LIMIT_KEYS = {"security_opt", "mem_limit", "memswap_limit", "cpus", "pids_limit", "labels"}


def reach_violations(name: str, service: dict[str, Any], policy: SandboxPolicy) -> list[str]:
    """What lets a service reach past its box: the relay's way out taken by another service
    or the relay holding more than the fleet gave it, an image from a registry host, a
    Dockerfile outside its build's context."""
    found = []
    if name == RELAY and (service.get("entrypoint") or service.get("image") != RELAY_IMAGE):
        found.append(f"{name} is not the fleet's relay")
    if name == RELAY and set(service) - RELAY_KEYS - LIMIT_KEYS:
        found.append(f"{name} holds more than the relay")
    if name != RELAY and any(n in policy.open_networks for n in service.get("networks") or {}):
        found.append(f"{name} joins the way out")
    image = str(service.get("image") or "")
    first = image.split("/", 1)[0] if "/" in image else ""
    if "." in first or ":" in first or first == "localhost":
        found.append(f"{name}.image {image}")
    build = service.get("build") or {}
    if build:
        context = os.path.realpath(build["context"])
        dockerfile = os.path.realpath(os.path.join(context, build.get("dockerfile", "Dockerfile")))
        if not dockerfile.startswith(context + "/"):
            found.append(f"{name}.build.dockerfile {dockerfile}")
    return found


def forbidden_in(document: dict[str, Any]) -> bool:
    return any(key in FORBIDDEN for service in document["services"].values() for key in service)


@pytest.fixture(scope="module")
def drawn_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    task = write_task(tmp_path_factory.mktemp("drawn") / "drawn-task")
    (task / "environment" / "data").mkdir()
    (task / "environment" / "link-out").symlink_to("/etc")
    return task


def policy_for(task: Path) -> SandboxPolicy:
    return SandboxPolicy(
        limits=LIMITS,
        labels=LABELS,
        mount_roots=(os.path.realpath(task),),
        closed=True,
        open_networks=frozenset({"egress"}),
        relay=RELAY,
        relay_image=RELAY_IMAGE,
    )


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_drawn_task_is_confined_or_refused_never_widened(
    data: st.DataObject, drawn_task: Path, docker_config: Path
) -> None:
    document = data.draw(compose_files(drawn_task))
    rendered = render(drawn_task, document, docker_config)
    if rendered is None:
        return  # Compose itself refuses it: no trial would start
    policy = policy_for(drawn_task)
    if forbidden_in(document):
        with pytest.raises(PolicyRefusal, match=r"^task drawn-task: "):
            confine(rendered, policy, "drawn-task", os.path.realpath)
        return
    try:
        confined = confine(rendered, policy, "drawn-task", os.path.realpath)
    except PolicyRefusal:
        return  # refused for a value (a bind, a network's way out), not a key
    assert not forbidden_in(document), f"a forbidden key was let through: {document}"
    assert violations(confined, policy) == [], document


def test_the_checker_sees_a_model_the_policy_should_have_refused(
    drawn_task: Path, docker_config: Path
) -> None:
    """Planted: an operator allows ``privileged`` and binds from anywhere (a policy that lets
    the key through); the checker names both."""
    document = {"services": {"main": {"privileged": True, "volumes": ["/:/host"]}}}
    rendered = render(drawn_task, document, docker_config)
    assert rendered is not None
    lax = dataclasses.replace(policy_for(drawn_task), allowed=frozenset({"privileged", "volumes"}))
    found = violations(confine(rendered, lax, "drawn-task", os.path.realpath), lax)
    assert "main.privileged" in found
    assert "main.volumes bind /" in found
    with pytest.raises(PolicyRefusal, match=r"services\.main\.privileged"):
        confine(rendered, policy_for(drawn_task), "drawn-task", os.path.realpath)


def test_the_checker_sees_every_way_out_the_review_found(
    drawn_task: Path, docker_config: Path
) -> None:
    """Planted in a model the policy confined: each way out a hostile task author found in
    an outside review, put back by hand; the checker names every one."""
    rendered = render(drawn_task, {"services": {"main": {}}}, docker_config)
    assert rendered is not None
    policy = policy_for(drawn_task)
    model = confine(rendered, policy, "drawn-task", os.path.realpath)
    assert violations(model, policy) == []
    planted = json.loads(json.dumps(model))
    planted["services"]["main"]["environment"] = {"LEAK": CANARY}
    planted["services"][RELAY]["entrypoint"] = ["python3", "-c", "print(1)"]
    planted["services"]["main"]["image"] = "127.0.0.1:16399/meta-data:x"
    planted["services"]["main"]["build"] = {"context": str(drawn_task), "dockerfile": "/etc/x"}
    planted["networks"]["default"]["name"] = "victim_default"
    planted["services"]["main"]["networks"] = {"egress": None}
    found = violations(planted, policy)
    for expected in (
        "the workers' environment",
        f"{RELAY} is not the fleet's relay",
        "main.image 127.0.0.1:16399/meta-data:x",
        "main.build.dockerfile /etc/x",
        "networks.default.name=victim_default",
        "main joins the way out",
    ):
        assert expected in found, (expected, found)


SAMPLE = [
    {"services": {"main": {"mem_limit": "64g", "cap_drop": ["NET_RAW"], "init": True}}},
    {"services": {"main": {"networks": ["wide"]}}, "networks": {"wide": {}}},
    {"services": {"main": {"volumes": ["./data:/data:ro"], "pids_limit": 100000}}},
    {"services": {"main": {"cap_add": ["NET_ADMIN"]}}},
    {
        "services": {
            "main": {},
            "helper": {"image": "python:3.12-slim-bookworm", "command": ["sleep", "infinity"]},
        }
    },
    {"services": {"main": {"volumes": ["./link-out:/escape"]}}},
]


def test_a_sample_of_drawn_tasks_runs_on_the_engine_and_ends_once(
    engine: docker.DockerClient,
    docker_config: Path,
    start_fleet: StartFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The examples above (allowed and refused shapes alike) as tasks of one dataset."""
    root = tmp_path_factory.mktemp("sample")
    tasks = root / "tasks"
    for number, document in enumerate(SAMPLE):
        task = write_task(tasks / f"drawn-{number}")
        (task / "environment" / "data").mkdir()
        (task / "environment" / "link-out").symlink_to("/etc")
        (task / "environment" / "docker-compose.yaml").write_text(json.dumps(document))
    main = root / "main.py"
    main.write_text(
        "from osmosis_ai.rollout.backend.harbor import HarborBackend, TaskMode\n"
        f"backend = HarborBackend(tasks_dir={str(tasks)!r}, task_mode=TaskMode.DATASET, "
        "agent='oracle')\n"
    )
    fleet = start_fleet(
        str(main), handle=V2FleetUnderTest, workers=1, env=sandbox_env(engine, docker_config)
    )
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        admitted = {
            number: fleet.admitted(metadata={"harbor_task_id": f"drawn-{number}"})
            for number in range(len(SAMPLE))
        }
        done = {number: fleet.result(*ids, timeout=300) for number, ids in admitted.items()}
        for number, result in done.items():
            if forbidden_in(SAMPLE[number]):
                assert result["status"] == "failure", result
                assert result["err_category"] == "validation_error", result
                assert f"task drawn-{number}" in result["err_message"]
            elif number == len(SAMPLE) - 1:
                # It mounts a link out of the task: the prepared copy drops such links, and a
                # task's bind never creates its source, so its sandbox does not start.
                assert result["status"] == "failure", result
                assert "docker compose up failed" in result["err_message"], result
            else:
                assert result["status"] == "success", (SAMPLE[number], result)
                assert result["sample"]["reward"] == 1.0
            assert fleet.poll(*admitted[number]).json() == result  # one result
        none_left(engine, fleet_label(fleet), within=10)
        assert not labelled(engine, fleet_label(fleet))["networks"]
    finally:
        fleet.close()
