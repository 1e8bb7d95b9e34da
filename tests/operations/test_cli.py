"""``rollout-fleet`` as an operator meets it, run as real processes: ``flower`` never serves
the dashboard without a login; ``status``, ``ls``, ``cancel`` and ``export`` say on stderr
which fleet they read (its Redis, password masked, and key prefix), and every way of not
reading it (none set, Redis unreachable or silent, a refused password, no fleet there or
under that prefix) is one line on stderr and exit 2, within seconds; ``ls`` keeps ids whole
at 80 columns. An invalid setting, or a URL that is not a Redis URL, is one line for every
command."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cli_start import seed_fleet
from rollout_fleet import state
from rollout_fleet.local import fleet_command
from rollout_fleet.processes import free_port
from rollout_fleet.redis_server import RedisServer
from tests.harness import SCRIPTED_AGENT

PASSWORD = "s3cret-pass"
LONG_ID = "rollout-2026-05-01T12:00:00-batch-0042-sample-0007-7f3a9c2e"  # 60 characters
READERS = [["status", "some-id"], ["ls"], ["cancel", "some-id"], ["export"]]
SET_URL = "set REDIS_URL to the fleet's Redis"


def test_flower_refuses_to_start_without_a_login() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    argv = fleet_command("flower", "--port", "1")
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "set FLOWER_BASIC_AUTH=user:password" in result.stdout


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """This environment without any Redis or fleet setting, and a runtime directory of the
    test's own: no ``rollout-fleet up`` state from elsewhere is found."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "REDIS_URL" and not key.startswith("ROLLOUT_FLEET_")
    }
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    return {**env, "XDG_RUNTIME_DIR": str(runtime)}


def fleet_cli(
    cwd: Path, env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``rollout-fleet ARGS`` in ``cwd`` (no ``.env`` there); the result and its time."""
    started = time.monotonic()
    done = subprocess.run(
        fleet_command(*args),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize("args", READERS, ids=lambda args: args[0])
def test_an_unreachable_redis_is_one_line_and_exit_2_within_seconds(
    tmp_path: Path, clean_env: dict[str, str], args: list[str]
) -> None:
    port = free_port()  # nothing listens there
    env = {**clean_env, "REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{port}/0"}
    done, took = fleet_cli(tmp_path, env, *args)
    assert done.returncode == 2
    assert done.stderr == (
        f"cannot reach Redis at redis://:***@127.0.0.1:{port}/0 (from REDIS_URL): connection "
        f"refused; start it, or {SET_URL}\n"
    )
    assert done.stdout == ""
    assert took < 5


def test_a_redis_that_never_answers_is_given_up_within_seconds(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        env = {**clean_env, "ROLLOUT_FLEET_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        done, took = fleet_cli(tmp_path, env, "ls")
    assert done.returncode == 2
    assert done.stderr == (
        f"cannot reach Redis at redis://127.0.0.1:{port}/0 (from ROLLOUT_FLEET_REDIS_URL): no "
        f"answer within 2 s; check that it runs and the network reaches it, or {SET_URL}\n"
    )
    assert took < 5


@pytest.mark.parametrize("args", READERS, ids=lambda args: args[0])
def test_without_redis_url_or_a_running_up_the_cli_reads_no_default(
    tmp_path: Path, clean_env: dict[str, str], args: list[str]
) -> None:
    done, _ = fleet_cli(tmp_path, clean_env, *args)
    assert done.returncode == 2
    assert done.stderr == (
        "no fleet to read: REDIS_URL is not set and no rollout-fleet up runs here; set "
        "REDIS_URL=redis://HOST:PORT/DB (and ROLLOUT_FLEET_KEY_PREFIX if not rf), or start "
        "one with rollout-fleet up\n"
    )
    assert done.stdout == ""


def test_a_url_of_another_scheme_is_one_line(tmp_path: Path, clean_env: dict[str, str]) -> None:
    env = {**clean_env, "REDIS_URL": f"http://user:{PASSWORD}@127.0.0.1:1/"}
    done, _ = fleet_cli(tmp_path, env, "ls")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "not a Redis URL: http://user:***@127.0.0.1:1/ (from REDIS_URL) (Redis URL must specify"
    )
    assert done.stderr.endswith("; use redis://[:PASSWORD@]HOST:PORT/DB\n")
    assert PASSWORD not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def guarded_redis() -> Iterator[RedisServer]:
    """A Redis with a password, holding a fleet (key prefix ``rf``) in database 0 with two
    rollouts, one of them with a long id; database 1 holds nothing."""
    server = RedisServer(password=PASSWORD).start()
    try:
        asyncio.run(seed_fleet(server.url, [LONG_ID, "short-1"]))
        yield server
    finally:
        server.stop()


def with_redis(env: dict[str, str], url: str, **settings: str) -> dict[str, str]:
    return {**env, "REDIS_URL": url, **settings}


def source_line(server: RedisServer, source: str = "REDIS_URL", database: int = 0) -> str:
    masked = f"redis://:***@127.0.0.1:{server.port}/{database}"
    return f"fleet: key prefix 'rf' on {masked} (from {source})\n"


def test_the_source_line_names_redis_masked_and_the_prefix_on_stderr_only(
    tmp_path: Path, clean_env: dict[str, str], guarded_redis: RedisServer
) -> None:
    env = with_redis(clean_env, guarded_redis.url)
    done, _ = fleet_cli(tmp_path, env, "status", "short-1", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == source_line(guarded_redis)
    assert json.loads(done.stdout)["rollout_id"] == "short-1"  # stdout is the JSON alone
    assert PASSWORD not in done.stdout + done.stderr


def test_the_newest_running_up_is_read_and_named(
    tmp_path: Path,
    clean_env: dict[str, str],
    guarded_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", clean_env["XDG_RUNTIME_DIR"])
    # an up's state file, for a process that is alive (this one)
    state.announce(state.UpFleet(os.getpid(), guarded_redis.url, "rf", "http://x", time.time()))
    done, _ = fleet_cli(tmp_path, clean_env, "ls", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == source_line(guarded_redis, f"rollout-fleet up, pid {os.getpid()}")
    assert {view["rollout_id"] for view in json.loads(done.stdout)} == {LONG_ID, "short-1"}


def test_ls_at_80_columns_shows_a_long_id_whole_on_one_line(
    tmp_path: Path, clean_env: dict[str, str], guarded_redis: RedisServer
) -> None:
    env = with_redis(clean_env, guarded_redis.url, COLUMNS="80")
    done, _ = fleet_cli(tmp_path, env, "ls")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert LONG_ID in [line.strip() for line in lines]
    assert "short-1" in [line.strip() for line in lines]
    assert max(len(line) for line in lines) <= 80
    assert lines[-1] == "2 rollouts"


def test_ls_at_200_columns_is_one_row_per_rollout(
    tmp_path: Path, clean_env: dict[str, str], guarded_redis: RedisServer
) -> None:
    env = with_redis(clean_env, guarded_redis.url, COLUMNS="200")
    done, _ = fleet_cli(tmp_path, env, "ls")
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["rollout", "proto", "status", "try", "age", "s", "run", "s", "worker", "error"] in rows
    by_id = {row[0]: row[1:4] for row in rows if row and row[0] in (LONG_ID, "short-1")}
    assert by_id == {LONG_ID: ["v2", "queued", "0"], "short-1": ["v2", "queued", "0"]}


@pytest.mark.parametrize(
    ("password", "problem"),
    [("wrong-pass", "refused the password"), (None, "wants a password")],
    ids=["wrong", "missing"],
)
def test_a_refused_password_is_one_line(
    tmp_path: Path,
    clean_env: dict[str, str],
    guarded_redis: RedisServer,
    password: str | None,
    problem: str,
) -> None:
    auth = f":{password}@" if password else ""
    url = f"redis://{auth}127.0.0.1:{guarded_redis.port}/0"
    done, _ = fleet_cli(tmp_path, with_redis(clean_env, url), "ls")
    assert done.returncode == 2
    shown = url.replace(password, "***") if password else url
    assert done.stderr == (
        f"Redis at {shown} (from REDIS_URL) {problem}; put the fleet's password in REDIS_URL: "
        "redis://:PASSWORD@HOST:PORT/DB\n"
    )


def test_another_key_prefix_is_named_with_the_one_there(
    tmp_path: Path, clean_env: dict[str, str], guarded_redis: RedisServer
) -> None:
    env = with_redis(clean_env, guarded_redis.url, ROLLOUT_FLEET_KEY_PREFIX="other")
    done, _ = fleet_cli(tmp_path, env, "status", "short-1")
    assert done.returncode == 2
    assert done.stderr == (
        f"no fleet with key prefix 'other' on redis://:***@127.0.0.1:{guarded_redis.port}/0 "
        "(from REDIS_URL): the fleet there uses key prefix 'rf'; set ROLLOUT_FLEET_KEY_PREFIX=rf\n"
    )


def test_a_redis_without_a_fleet_is_not_read_as_an_empty_one(
    tmp_path: Path, clean_env: dict[str, str], guarded_redis: RedisServer
) -> None:
    done, _ = fleet_cli(tmp_path, with_redis(clean_env, guarded_redis.url_for(1)), "ls")
    assert done.returncode == 2
    assert done.stderr == (
        f"no fleet on redis://:***@127.0.0.1:{guarded_redis.port}/1 (from REDIS_URL): no fleet "
        f"with key prefix 'rf' ever ran there; {SET_URL} (and ROLLOUT_FLEET_KEY_PREFIX to its "
        "prefix)\n"
    )
    assert done.stdout == ""


def test_an_unknown_status_is_one_line(
    tmp_path: Path, clean_env: dict[str, str], guarded_redis: RedisServer
) -> None:
    done, _ = fleet_cli(tmp_path, with_redis(clean_env, guarded_redis.url), "ls", "-s", "done")
    assert done.returncode == 2
    assert done.stderr == (
        "no status 'done': --status takes one of admitting, queued, running, grading, "
        "delivering, success, failure, cancelled\n"
    )


def test_a_process_command_refuses_a_url_that_is_not_redis_in_one_line(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    env = {
        **clean_env,
        "REDIS_URL": f"http://user:{PASSWORD}@127.0.0.1:1/",
        "AGENT": SCRIPTED_AGENT,
    }
    done, _ = fleet_cli(tmp_path, env, "worker")
    assert done.returncode == 2
    assert done.stderr.startswith("not a Redis URL: http://user:***@127.0.0.1:1/ (from REDIS_URL)")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [["probe", "worker"], ["probe", "gateway"], ["ls"]])
def test_an_invalid_setting_is_one_line(
    tmp_path: Path, clean_env: dict[str, str], args: list[str]
) -> None:
    env = {**clean_env, "ROLLOUT_FLEET_LEASE_SECONDS": "soon", "REDIS_URL": "redis://x:1/0"}
    done, _ = fleet_cli(tmp_path, env, *args)
    assert done.returncode == 2
    assert done.stderr == (
        "invalid setting ROLLOUT_FLEET_LEASE_SECONDS: Input should be a valid number, unable "
        "to parse string as a number\n"
    )


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ROLLOUT_FLEET_REDIS_RESERVE_FRACTION", "0.6", "less than or equal to 0.5"),
        ("ROLLOUT_FLEET_REDIS_RESERVE_FRACTION", "-0.1", "greater than or equal to 0"),
        ("ROLLOUT_FLEET_REDIS_RESERVE_FRACTION", "nan", "less than or equal to 0.5"),
        ("ROLLOUT_FLEET_REDIS_FINISH_ROOM_FACTOR", "0.5", "greater than or equal to 1"),
        ("ROLLOUT_FLEET_REDIS_FINISH_ROOM_FACTOR", "inf", "less than or equal to 100"),
    ],
)
def test_a_headroom_setting_out_of_its_range_is_one_line(
    tmp_path: Path, clean_env: dict[str, str], name: str, value: str, says: str
) -> None:
    env = {**clean_env, name: value, "REDIS_URL": "redis://x:1/0"}
    done, _ = fleet_cli(tmp_path, env, "gateway")
    assert done.returncode == 2
    assert done.stderr == f"invalid setting {name}: Input should be {says}\n"


@pytest.mark.parametrize("command", ["worker", "gateway"])
def test_a_secret_key_that_is_not_a_fernet_key_is_one_line_naming_which(
    tmp_path: Path, clean_env: dict[str, str], command: str
) -> None:
    """Before: a traceback ending in cryptography's ValueError. The key is never shown."""
    good = "A" * 43 + "="
    env = {
        **clean_env,
        "ROLLOUT_FLEET_SECRET_KEY": f"{good},not-a-fernet-key",
        "REDIS_URL": "redis://x:1/0",
    }
    done, _ = fleet_cli(tmp_path, env, command)
    assert done.returncode == 2
    assert done.stderr == (
        "invalid setting ROLLOUT_FLEET_SECRET_KEY: key 2 of 2 is not a Fernet key (32 url-safe "
        "base64-encoded bytes, as Fernet.generate_key() makes)\n"
    )
