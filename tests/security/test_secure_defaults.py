"""Secure by default: no open gateway by accident, drain fences that
expire, trainer URLs that cannot aim the workers at metadata services or arbitrary paths, no
foreign endpoint's body stored or returned, worker metrics on loopback. Real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from rollout_fleet.local import fleet_command
from rollout_fleet.processes import ManagedProcess, free_port, port_open, wait_until
from rollout_fleet.redis_server import RedisServer
from tests.conftest import V2_ENV, StartFleet
from tests.harness import SCRIPTED_AGENT, SCRIPTED_V2_AGENT, new_id, v2_body

SERVER_KEY = "server-key-f18"


def gateway_env(redis_server: RedisServer, **extra: str) -> dict[str, str]:
    """A gateway's environment; open gateways use a database of their own (a gateway without
    a key refuses to start beside live gateways requiring one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_FLEET_")}
    database = 900 if "ROLLOUT_FLEET_API_KEY" in extra else 902
    url = redis_server.url_for(database)
    return {**env, "REDIS_URL": url, "AGENT": SCRIPTED_AGENT, **extra}


def test_a_gateway_without_a_key_refuses_a_non_loopback_address(
    redis_server: RedisServer,
) -> None:
    port = free_port()
    argv = fleet_command("gateway", "--host", "0.0.0.0", "--port", str(port))
    env = gateway_env(redis_server)
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    assert "ROLLOUT_FLEET_API_KEY" in refused.stdout + refused.stderr
    assert "ROLLOUT_FLEET_INSECURE_OPEN_GATEWAY" in refused.stdout + refused.stderr


@pytest.mark.parametrize(
    "env",
    [{"ROLLOUT_FLEET_API_KEY": SERVER_KEY}, {"ROLLOUT_FLEET_INSECURE_OPEN_GATEWAY": "true"}],
    ids=["with a key", "open on purpose"],
)
def test_a_gateway_with_a_key_or_told_to_run_open_starts(
    redis_server: RedisServer, tmp_path: Path, env: dict[str, str]
) -> None:
    port = free_port()
    argv = fleet_command("gateway", "--host", "0.0.0.0", "--port", str(port))
    log = tmp_path / "gateway.log"
    process = ManagedProcess("gateway", argv, gateway_env(redis_server, **env), log).start()
    try:
        wait_until(lambda: port_open(port), 60, "the gateway")
        assert process.alive()
    finally:
        process.stop()


def uvicorn_gateway(port: int, host: str = "0.0.0.0") -> list[str]:
    """The gateway app under plain uvicorn, as an operator might run it without the CLI."""
    app = "rollout_gateway.app:create_app"
    return [sys.executable, "-m", "uvicorn", app, "--factory", "--host", host, "--port", str(port)]


def test_the_gateway_app_under_plain_uvicorn_refuses_a_non_loopback_address(
    redis_server: RedisServer,
) -> None:
    """The refusal is the app's, not only the CLI's: one line, no traceback, no port open."""
    port = free_port()
    refused = subprocess.run(
        uvicorn_gateway(port),
        env=gateway_env(redis_server),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output
    lines = [line for line in output.splitlines() if "refusing to listen on 0.0.0.0" in line]
    assert len(lines) == 1, output
    assert "ROLLOUT_FLEET_API_KEY" in lines[0]
    assert "ROLLOUT_FLEET_INSECURE_OPEN_GATEWAY" in lines[0]
    assert "Traceback" not in output
    assert "Uvicorn running" not in output
    assert not port_open(port)


@pytest.mark.parametrize(
    ("host", "env"),
    [
        ("0.0.0.0", {"ROLLOUT_FLEET_API_KEY": SERVER_KEY}),
        ("0.0.0.0", {"ROLLOUT_FLEET_INSECURE_OPEN_GATEWAY": "true"}),
        ("127.0.0.1", {}),
    ],
    ids=["with a key", "open on purpose", "loopback"],
)
def test_the_gateway_app_under_plain_uvicorn_starts_when_it_may(
    redis_server: RedisServer, tmp_path: Path, host: str, env: dict[str, str]
) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    env = gateway_env(redis_server, **env)
    process = ManagedProcess("gateway", uvicorn_gateway(port, host), env, log).start()
    try:
        wait_until(lambda: port_open(port), 60, "the gateway")
        headers = {"Authorization": f"Bearer {SERVER_KEY}"}
        assert httpx.get(f"http://127.0.0.1:{port}/ready", headers=headers).status_code == 200
    finally:
        process.stop()


def outward_ipv4() -> str | None:
    """One of this machine's non-loopback IPv4 addresses, if it has one."""
    outward = [
        address.address
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family == socket.AF_INET and not address.address.startswith("127.")
    ]
    return outward[0] if outward else None


def test_where_the_app_cannot_learn_its_address_it_refuses_requests_from_outside(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Given a listening socket (``--fd``), uvicorn does not say where it listens: the app
    starts, and a request that arrives on a non-loopback address gets 503 and the refusal."""
    outward = outward_ipv4()
    if outward is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    listening = socket.create_server(("0.0.0.0", 0))
    port = listening.getsockname()[1]
    argv = [*uvicorn_gateway(port)[:5], "--fd", str(listening.fileno())]
    with (tmp_path / "gateway.log").open("wb") as log:
        process = subprocess.Popen(
            argv,
            env=gateway_env(redis_server),
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(listening.fileno(),),
        )
    listening.close()
    try:
        inside = f"http://127.0.0.1:{port}/ready"
        wait_until(lambda: httpx.get(inside).status_code == 200, 60, "the gateway")
        outside = httpx.get(f"http://{outward}:{port}/ready", timeout=10)
        assert outside.status_code == 503, outside.text
        assert "refusing to listen on" in outside.json()["detail"]
    finally:
        process.terminate()
        process.wait(30)


def test_a_drain_fence_expires(start_fleet: StartFleet) -> None:
    """A drain nobody lifts does not refuse admissions forever."""
    env = {**V2_ENV, "ROLLOUT_FLEET_API_KEY": SERVER_KEY, "ROLLOUT_FLEET_DRAIN_FENCE_SECONDS": "2"}
    handle = start_fleet(SCRIPTED_V2_AGENT, workers=1, env=env)
    auth = {"Authorization": f"Bearer {SERVER_KEY}"}
    assert handle.http.post("/drain", json={"timeout_sec": 0}, headers=auth).status_code == 200
    body = v2_body(handle.trainer.url)
    assert handle.http.post("/rollout", json=body, headers=auth).status_code == 503
    time.sleep(2.5)
    assert handle.http.post("/rollout", json=body, headers=auth).status_code == 202


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/?x=",  # the fleet appends /v1/rollout/completed: a parameter now
        "http://127.0.0.1:9/base#frag",
        "http://169.254.169.254/latest",
        "http://[fe80::1]:80/",
        "http://100.100.100.200/",
        "http://metadata.google.internal/",
    ],
)
def test_trainer_urls_that_aim_elsewhere_are_refused_whatever_the_allow_list(
    start_fleet: StartFleet, url: str
) -> None:
    handle = start_fleet(workers=0)
    rollout_id = new_id("ssrf")
    response = handle.init(handle.body(rollout_id, server_url=url))
    assert response.status_code == 422, response.text
    assert "server_url" in response.text
    assert not handle.record(rollout_id)


def test_a_v2_chat_completions_url_at_a_metadata_address_is_refused(
    start_fleet: StartFleet,
) -> None:
    handle = start_fleet(SCRIPTED_V2_AGENT, workers=0, env=V2_ENV)
    for url in ("http://169.254.169.254/v1", "http://127.0.0.1:9/v1?x="):
        body = v2_body(handle.trainer.url, chat_completions_url=url)
        response = handle.http.post("/rollout", json=body)
        assert response.status_code == 422, response.text
        assert "chat_completions_url" in response.text


def test_a_foreign_endpoints_answer_is_never_stored_or_returned(
    start_fleet: StartFleet,
) -> None:
    handle = start_fleet(workers=1)
    rollout_id = new_id("foreign")
    handle.trainer.add_faults(
        {"target": "completed", "status": 404, "rollout_id": rollout_id, "times": None}
    )
    assert handle.init(handle.body(rollout_id)).status_code == 202
    record = handle.wait_status(rollout_id, {"success"}, timeout=30)
    assert record["delivery"] == "failed: the trainer answered HTTP 404"
    view = httpx.get(f"{handle.fleet.gateway_url}/v1/rollouts/{rollout_id}").text
    for seen in (view, str(handle.record(rollout_id))):
        assert "injected fault" not in seen  # the mock TrainGate's error body


def test_worker_metrics_listen_on_loopback_unless_told(start_fleet: StartFleet) -> None:
    """Before, a worker's ``/metrics`` listened on every interface."""
    outward = outward_ipv4()
    if outward is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    handle = start_fleet(workers=1)
    port = handle.fleet.worker_metrics_ports[1]
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{outward}:{port}/metrics", timeout=10)
