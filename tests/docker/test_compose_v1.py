"""The compose stack as a user starts it — the README's commands in a fresh
checkout, both images built from the Dockerfiles unmodified through ``docker compose``, the
repository's ``docker-compose.yml`` unmodified — serving the bundled calculator agent (v1),
then scaled, faulted at the container level, and removed.

The tests share one stack and run in file order; each leaves it serving (four workers from
the scale test on), and the last removes it with ``docker compose down -v``.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.docker.stack import PROJECT, Stack, wait_for
from tests.harness import (
    MockTrainGateClient,
    admit_all,
    calculator_bodies,
    redis_dump,
    screenshot_dir,
)

ROLLOUTS = 30
TRAINER_KEY = f"planted-trainer-key-{secrets.token_hex(8)}"  # sent in requests
FLEET_SERVICES = ("gateway", "worker", "flower")


@pytest.fixture(scope="module")
def stack_settings() -> dict[str, str]:
    # A stopping worker's grace (.env.example; 60 s by default), short so that
    # `docker compose stop worker` hands running rollouts back within seconds.
    return {"ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS": "5"}


@pytest.fixture(scope="module")
def trainer(stack: Stack) -> MockTrainGateClient:
    assert stack.trainer is not None
    return stack.trainer.client()


def run(stack: Stack, trainer: MockTrainGateClient, count: int) -> list[dict[str, Any]]:
    """Admit ``count`` calculator rollouts through the published gateway port."""
    bodies = calculator_bodies(trainer.url, count, api_key=TRAINER_KEY)
    with stack.gateway() as gateway:
        admit_all(gateway, bodies)
    return bodies


def delivered(
    stack: Stack, trainer: MockTrainGateClient, bodies: list[dict[str, Any]], timeout: float
) -> dict[str, list[dict[str, Any]]]:
    """Wait for every rollout's callback; all deliveries of these rollouts."""
    ids = {body["rollout_id"] for body in bodies}
    try:
        wait_for(lambda: ids <= trainer.deliveries().keys(), timeout, "every callback", every=1)
    except AssertionError as exc:
        missing = ids - trainer.deliveries().keys()
        raise AssertionError(f"{len(missing)} never called back\n{stack.logs()[-20000:]}") from exc
    return {k: v for k, v in trainer.deliveries().items() if k in ids}


def assert_completed_once(
    stack: Stack, bodies: list[dict[str, Any]], deliveries: dict[str, list[dict[str, Any]]]
) -> None:
    records = stack.records("v1", [body["rollout_id"] for body in bodies])
    for body, record in zip(bodies, records, strict=True):
        (done,) = deliveries[body["rollout_id"]]  # exactly one callback each
        assert done["status"] == "COMPLETED", done
        truth = body["metadata"]["ground_truth"]
        assert done["reward"] == (0.0 if truth == "-1" else 1.0)
        assert record["terminations"] == "1"


def statuses(stack: Stack, bodies: list[dict[str, Any]]) -> Counter[str]:
    return Counter(
        r.get("status", "?") for r in stack.records("v1", [b["rollout_id"] for b in bodies])
    )


@pytest.fixture(scope="module")
def monitor(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every command Redis executes (records, Lua arguments, broker messages), to a file."""
    output = tmp_path_factory.mktemp("monitor") / "monitor.log"
    address = stack.address(stack.container("redis"))
    with output.open("wb") as log:
        process = subprocess.Popen(
            ["redis-cli", "-h", address, "-p", stack.setting("REDIS_PORT"), "monitor"],
            env={"PATH": os.environ["PATH"], "REDISCLI_AUTH": stack.setting("REDIS_PASSWORD")},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: output.read_text().startswith("OK"), 30, "MONITOR")
        yield output
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def calculator_run(
    stack: Stack, trainer: MockTrainGateClient, monitor: Path
) -> list[dict[str, Any]]:
    bodies = run(stack, trainer, ROLLOUTS)
    assert_completed_once(stack, bodies, delivered(stack, trainer, bodies, 120))
    return bodies


# --- up --------------------------------------------------------------------------------------


def test_the_readme_commands_build_both_images_and_start_every_service_healthy(
    stack: Stack,
) -> None:
    print(f"built and up in {stack.up_seconds:.0f}s")
    running = Counter(c.labels["com.docker.compose.service"] for c in stack.containers())
    assert running == {"redis": 1, "gateway": 1, "worker": 2, "flower": 1}
    assert set(stack.states().values()) == {"healthy"}, stack.states()
    images = {
        c.labels["com.docker.compose.service"]: c.attrs["Config"]["Image"]
        for c in stack.containers()
    }
    assert images["gateway"] == "rollout-fleet-gateway:latest"
    assert images["worker"] == images["flower"] == "rollout-fleet-worker:latest"
    assert stack.ready() == {
        "ready": True,
        "agent": "calculator",
        "protocol": "v1",
        "redis": "ok",
        "workers": 2,
        "capacity": 200,  # 2 replicas x ROLLOUT_FLEET_WORKER_CONCURRENCY from .env.example
        "get_tools": "ok",
        "durability": "ok",  # the compose Redis keeps an append-only file
        "replicas": "ok",
        "queue": "ok",
        "sandbox_slots": 0,  # the calculator runs no sandboxes
        "sandboxes": 0,
    }


def test_the_fleet_runs_unprivileged_under_an_init_with_the_agent_read_only(stack: Stack) -> None:
    for service in FLEET_SERVICES:
        for container in stack.containers(service):
            assert container.attrs["Config"]["User"] == "10001"
            assert container.attrs["HostConfig"]["Init"] is True
            top = container.top(ps_args="-eo pid,uid,args")["Processes"]
            assert top[0][2].startswith("/sbin/docker-init -- rollout-fleet "), top
            assert {uid for _, uid, _ in top} == {"10001"}, top
            if service == "flower":
                continue
            (mount,) = container.attrs["Mounts"]
            assert (mount["Destination"], mount["RW"]) == ("/agent", False)
            code, output = container.exec_run(["sh", "-c", "touch /agent/x"])
            assert code != 0
            assert b"Read-only file system" in output


def test_redis_is_durable_guarded_and_unpublished(stack: Stack) -> None:
    store = stack.redis()
    assert store.config_get("appendonly") == {"appendonly": "yes"}
    assert store.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert store.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert store.config_get("maxmemory") == {"maxmemory": str(2 * 1024**3)}
    anonymous = redis.Redis(host=stack.address(stack.container("redis")), socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    assert stack.container("redis").attrs["NetworkSettings"]["Ports"] == {"6379/tcp": None}


# --- rollouts -------------------------------------------------------------------------------


def test_v1_calculator_rollouts_complete_with_one_callback_each_on_both_workers(
    stack: Stack, calculator_run: list[dict[str, Any]]
) -> None:
    records = stack.records("v1", [body["rollout_id"] for body in calculator_run])
    owners = Counter(record["container"] for record in records)
    assert "?" not in owners
    assert len(owners) == 2, f"both worker replicas should have run rollouts: {owners}"


@pytest.mark.parametrize("path", ["/", "/tasks", "/workers", "/api/tasks"])
def test_flower_refuses_anonymous_requests(stack: Stack, path: str) -> None:
    assert httpx.get(f"{stack.flower_url}{path}", timeout=30).status_code == 401
    response = httpx.get(f"{stack.flower_url}{path}", auth=stack.flower_login, timeout=30)
    assert response.status_code == 200


def test_a_browser_logs_into_flower_and_finds_the_rollouts(
    stack: Stack, calculator_run: list[dict[str, Any]], chromium: dict[str, Any]
) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    response = httpx.get(
        f"{stack.flower_url}/api/tasks", auth=stack.flower_login, params={"limit": 10_000}
    )
    tasks = list(response.json().values())
    for body in calculator_run:
        (task,) = [t for t in tasks if body["rollout_id"] in (t.get("args") or "")]
        assert (task["name"], task["args"], task["state"]) == (
            "rollout.run",
            repr(body["rollout_id"]),  # the id only, never the request
            "SUCCESS",
        )

    rollout_id = calculator_run[0]["rollout_id"]
    user, password = stack.flower_login
    output = screenshot_dir("docker-flower")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium)
        try:
            wrong = browser.new_context(http_credentials={"username": user, "password": "wrong"})
            refused = wrong.new_page().goto(f"{stack.flower_url}/tasks")
            assert refused is not None
            assert refused.status == 401
            context = browser.new_context(
                http_credentials={"username": user, "password": password},
                viewport={"width": 1600, "height": 900},
            )
            page = context.new_page()
            answered = page.goto(f"{stack.flower_url}/tasks")
            assert answered is not None
            assert answered.status == 200
            page.get_by_role("searchbox").fill(rollout_id)
            row = page.locator("table#tasks-table tbody tr", has_text=rollout_id)
            try:
                row.wait_for(timeout=30_000)
            except PlaywrightError:
                page.screenshot(path=output / "not-found.png", full_page=True)
                raise
            assert "rollout.run" in row.inner_text()
            assert "SUCCESS" in row.inner_text()
            page.screenshot(path=output / "tasks.png", full_page=True)
            page.goto(f"{stack.flower_url}/workers")
            page.get_by_text("worker-", exact=False).first.wait_for(timeout=30_000)
            page.screenshot(path=output / "workers.png", full_page=True)
        finally:
            browser.close()
    assert (output / "tasks.png").stat().st_size > 10_000


def test_no_secret_reaches_logs_redis_flower_or_the_images(
    stack: Stack,
    calculator_run: list[dict[str, Any]],
    trainer: MockTrainGateClient,
    monitor: Path,
) -> None:
    (call, *_) = trainer.calls("chat", calculator_run[0]["rollout_id"])
    assert call["headers"]["authorization"] == f"Bearer {TRAINER_KEY}"  # the key was in use
    planted = {
        name: stack.setting(name).rpartition(":")[2]  # Flower's: the password part
        for name in ("REDIS_PASSWORD", "FLOWER_BASIC_AUTH", "ROLLOUT_FLEET_API_KEY")
    }
    planted["trainer key"] = TRAINER_KEY
    flower = httpx.get(
        f"{stack.flower_url}/api/tasks", auth=stack.flower_login, params={"limit": 10_000}
    )
    images = {
        image: str(stack.engine.images.get(image).attrs)
        for image in {c.attrs["Config"]["Image"] for c in stack.containers()}
    }
    commands = monitor.read_text()
    assert '"task": "rollout.run"' in commands.replace('\\"', '"'), "MONITOR saw no message"
    places = {
        "service logs": stack.logs(),
        "Redis commands": commands,
        "Redis keys and values": redis_dump(stack.redis()),
        "Flower's task list": flower.text,
        "image configurations": "\n".join(images.values()),
    }
    leaks = [f"{n} in {p}" for p, text in places.items() for n, s in planted.items() if s in text]
    assert leaks == []
    for service in ("gateway", "worker"):
        code, _ = stack.containers(service)[0].exec_run(["test", "-e", "/app/.env"])
        assert code == 1  # .dockerignore keeps .env out of the build context


# --- scale ------------------------------------------------------------------------------------


def test_scaling_to_four_workers_adds_capacity_that_rollouts_use(
    stack: Stack, trainer: MockTrainGateClient
) -> None:
    stack.checkout.compose("up", "-d", "--scale", "worker=4", "--wait")
    assert len(stack.containers("worker")) == 4
    ready = wait_for(lambda: (r := stack.ready())["workers"] == 4 and r, 60, "4 workers ready")
    assert ready["capacity"] == 400
    trainer.configure(latency_s=0.2)  # long enough that one worker cannot take them all
    try:
        bodies = run(stack, trainer, 100)
        assert_completed_once(stack, bodies, delivered(stack, trainer, bodies, 180))
    finally:
        trainer.configure(latency_s=0)
    owners = Counter(r["container"] for r in stack.records("v1", [b["rollout_id"] for b in bodies]))
    assert set(owners) == {c.name for c in stack.containers("worker")}, owners


# --- faults -----------------------------------------------------------------------------------


def test_docker_kill_of_a_worker_mid_run_loses_nothing(
    stack: Stack, trainer: MockTrainGateClient
) -> None:
    trainer.configure(latency_s=2.0)  # each rollout calls the TrainGate 2-3 times
    try:
        bodies = run(stack, trainer, 40)
        ids = [body["rollout_id"] for body in bodies]
        victim = stack.containers("worker")[0]

        def held_by_victim() -> set[str]:
            return {
                rollout_id
                for rollout_id, record in zip(ids, stack.records("v1", ids), strict=True)
                if record.get("status") == "running" and record["container"] == victim.name
            }

        held = wait_for(lambda: len(found := held_by_victim()) >= 3 and found, 60, "held")
        killed_at = time.time()
        victim.kill()  # SIGKILL: no grace, no hand-back; its leases lapse
        deliveries = delivered(stack, trainer, bodies, 180)
    finally:
        trainer.configure(latency_s=0)
    victim.reload()
    assert victim.attrs["State"]["ExitCode"] == 137
    arrivals = trainer.http.get(f"{trainer.url}/mock/completed").json()["completed"]
    first = {rollout_id: at for rollout_id, at in reversed(arrivals)}
    records = dict(zip(ids, stack.records("v1", ids), strict=True))
    for rollout_id in ids:
        done = deliveries[rollout_id]
        assert {d["status"] for d in done} == {"COMPLETED"}
        # A repeat only for a callback the kill caught in flight (docs/RELIABILITY.md).
        assert len(done) == 1 or abs(first[rollout_id] - killed_at) < 1, done
        assert records[rollout_id]["terminations"] == "1"
    # What the killed worker held ran again elsewhere (the kill lands a few milliseconds
    # after the snapshot, 4-6 s before any of those rollouts could finish).
    for rollout_id in held:
        assert records[rollout_id]["attempt"] == "2", records[rollout_id]
        assert records[rollout_id]["container"] != victim.name
    stack.checkout.compose("up", "-d", "--scale", "worker=4", "--wait")  # the operator restarts it


def test_docker_kill_of_redis_mid_run_loses_nothing(
    stack: Stack, trainer: MockTrainGateClient
) -> None:
    trainer.configure(latency_s=1.0)
    try:
        bodies = run(stack, trainer, 40)
        wait_for(lambda: statuses(stack, bodies)["running"] >= 10, 60, "rollouts running")
        redis_container = stack.container("redis")
        redis_container.kill()  # SIGKILL: what the AOF (appendfsync everysec) holds is all
        redis_container.reload()
        assert redis_container.attrs["State"]["ExitCode"] == 137
        time.sleep(3)
        stack.checkout.compose("start", "redis")
        stack.wait_health("redis", "healthy", 60)
        deliveries = delivered(stack, trainer, bodies, 240)
    finally:
        trainer.configure(latency_s=0)
    assert_completed_once(stack, bodies, deliveries)


def test_compose_stop_worker_hands_rollouts_back_within_the_stop_grace_period(
    stack: Stack, trainer: MockTrainGateClient
) -> None:
    minutes = re.fullmatch(r"(\d+)m", stack.setting("WORKER_STOP_GRACE_PERIOD"))
    assert minutes is not None
    stop_grace = int(minutes.group(1)) * 60
    trainer.configure(latency_s=8.0)  # every rollout outlasts the workers' 5 s grace
    try:
        bodies = run(stack, trainer, 20)
        wait_for(lambda: statuses(stack, bodies)["running"] == 20, 60, "all 20 running")
        started = time.monotonic()
        stack.checkout.compose("stop", "worker", timeout=stop_grace + 60)
        took = time.monotonic() - started
        for worker in stack.containers("worker", all=True):
            state = worker.attrs["State"]
            assert (state["Status"], state["ExitCode"]) == ("exited", 0), state  # not killed
        assert took < stop_grace
        records = stack.records("v1", [b["rollout_id"] for b in bodies])
        assert {(r["status"], r["handoffs"]) for r in records} == {("queued", "1")}
        assert not set(trainer.deliveries()) & {b["rollout_id"] for b in bodies}
        trainer.configure(latency_s=0)
        stack.checkout.compose("start", "worker")
        deliveries = delivered(stack, trainer, bodies, 120)
    finally:
        trainer.configure(latency_s=0)
    assert_completed_once(stack, bodies, deliveries)
    print(f"docker compose stop worker: {took:.1f}s")


def test_healthchecks_turn_unhealthy_without_redis_and_healthy_again(stack: Stack) -> None:
    """The probes' promise: the gateway is ready, and a worker fresh, only while Redis
    answers. Compose's timings bound how soon each shows it: a gateway probe every 15 s,
    three failures; a worker's liveness file stale after 30 s, a probe every 30 s, three."""
    stack.wait_health("worker", "healthy", 120)
    stack.checkout.compose("stop", "redis")
    started = time.monotonic()
    gateway = stack.wait_health("gateway", "unhealthy", 15 * 4 + 10 * 3)
    stack.wait_health("worker", "unhealthy", 30 + 30 * 4 + 10 * 3 - gateway)
    assert stack.health(stack.container("flower")) == "healthy"  # Flower's probe is Flower's own
    down = time.monotonic() - started
    stack.checkout.compose("start", "redis")
    started = time.monotonic()
    for service in ("redis", "gateway", "worker"):
        stack.wait_health(service, "healthy", 120)
    back = time.monotonic() - started
    assert stack.ready()["workers"] == 4
    print(f"unhealthy after: gateway {gateway:.0f}s, workers {down:.0f}s; healthy {back:.0f}s")


# --- down -------------------------------------------------------------------------------------


def test_every_service_stops_on_sigterm_through_its_init(stack: Stack) -> None:
    """``init: true``: tini passes compose's SIGTERM on, and each process exits cleanly well
    before compose's 10 s (2 min for workers) would SIGKILL it (exit 137)."""
    started = time.monotonic()
    stack.checkout.compose("stop")
    took = time.monotonic() - started
    exits = {c.name: c.attrs["State"]["ExitCode"] for c in stack.containers(all=True)}
    assert set(exits.values()) == {0}, exits
    assert took < 10, f"docker compose stop took {took:.1f}s"


def test_down_v_leaves_no_container_network_or_volume(stack: Stack) -> None:
    stack.down()
    label: dict[str, str | list[str] | bool] = {"label": f"com.docker.compose.project={PROJECT}"}
    assert stack.engine.containers.list(all=True, filters=label) == []
    assert stack.engine.networks.list(filters=label) == []
    assert stack.engine.volumes.list(filters=label) == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{stack.gateway_url}/health", timeout=5)
