"""A gateway or worker that cannot start says why in one line and exits non-zero, never with a
traceback: an agent that does not load, an invalid setting (the fleet's or the SDK's), a Redis
that can lose rollouts, whether started by ``rollout-fleet gateway``/``worker`` or by plain
uvicorn. Before, uvicorn printed the factory's or the lifespan's traceback (40 lines for a
Redis without persistence) and a bad SDK setting was a pydantic error over several lines."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from rollout_fleet.local import fleet_command
from rollout_fleet.processes import free_port, port_open
from rollout_fleet.redis_server import RedisServer
from tests.harness import REPO, SCRIPTED_AGENT, assert_one_line, run_process

NO_PERSISTENCE = (
    "refusing to run: Redis can lose admitted rollouts: persistence is off (appendonly no, no "
    "save points), so a restart loses every admitted rollout (set appendonly yes). To run "
    "anyway, accepting the loss, set ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS=true."
)


def process_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_FLEET_", "OSMOSIS"))}
    return {**env, "REDIS_URL": redis_url, "AGENT": SCRIPTED_AGENT, **extra}


def command(name: str, port: int) -> list[str]:
    args = ["--host", "127.0.0.1", "--port", str(port)] if name == "gateway" else []
    return fleet_command(name, *args)


@pytest.fixture(scope="module")
def redis_without_persistence(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(appendonly=False, data_dir=tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


@pytest.mark.parametrize("name", ["gateway", "worker"])
@pytest.mark.parametrize(
    ("setting", "line"),
    [
        (
            {"AGENT": "main.py:nope"},
            f"cannot load the agent 'main.py:nope': agent file '{REPO}/main.py' does not exist",
        ),
        (
            {"OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "0"},
            "invalid setting OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS: Input should be greater "
            "than or equal to 1",
        ),
        (
            {"OSMOSIS_ROLLOUT_MAX_METADATA_SIZE_BYTES": "1"},
            "invalid setting OSMOSIS_ROLLOUT_MAX_METADATA_SIZE_BYTES: Input should be greater "
            "than or equal to 1024",
        ),
        (
            {"ROLLOUT_FLEET_LOG_FORMAT": "xml"},
            "invalid setting ROLLOUT_FLEET_LOG_FORMAT: Input should be 'text' or 'json'",
        ),
    ],
    ids=["agent", "sdk client setting", "sdk setting", "fleet setting"],
)
def test_a_process_that_cannot_start_says_why_in_one_line(
    redis_server: RedisServer, name: str, setting: dict[str, str], line: str
) -> None:
    port = free_port()
    result = run_process(command(name, port), process_env(redis_server.url_for(901), **setting))
    assert_one_line(result, line)
    assert not port_open(port)


@pytest.mark.parametrize("name", ["gateway", "worker"])
def test_a_redis_without_persistence_is_refused_in_one_line(
    redis_without_persistence: str, name: str
) -> None:
    result = run_process(command(name, free_port()), process_env(redis_without_persistence))
    assert_one_line(result, NO_PERSISTENCE)
    assert result.returncode == 2


def test_the_gateway_app_under_plain_uvicorn_refuses_such_a_redis_in_one_line(
    redis_without_persistence: str,
) -> None:
    """Without the CLI's check first: the app's own start refuses, in the same line."""
    port = free_port()
    app = "rollout_gateway.app:create_app"
    argv = [sys.executable, "-m", "uvicorn", app, "--factory", "--port", str(port)]
    result = run_process(argv, process_env(redis_without_persistence))
    assert_one_line(result, NO_PERSISTENCE)
    assert not port_open(port)
