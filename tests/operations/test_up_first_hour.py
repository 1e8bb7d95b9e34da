"""``rollout-fleet up`` in a newcomer's first hour, run for real as a subprocess: every mistake
a user test made stops it within seconds (it used to wait 60–78 s, then blame the gateway),
with one line naming the problem and the fix, a non-zero exit and no traceback; a process
that exits while the fleet starts stops it at once, naming that process's last line and log;
and a fleet with a server key (``ROLLOUT_FLEET_API_KEY``) becomes ready (it never did)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from rollout_fleet.processes import free_port
from rollout_fleet.redis_server import RedisServer
from tests.harness import REPO, agent_failing_in_the_gateway
from tests.operations.harness import (
    assert_all_gone,
    clean_env,
    fleet_args,
    listening_ports,
    run_folder,
    started_up,
)

CALCULATOR = "examples/calculator/server.py:agent_loop"
FAST_SECONDS = 20.0  # a refusal before anything starts (imports on a loaded 2-core machine)


@dataclass
class Refused:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_up(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Refused:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "rollout_fleet", "up", *args],
        cwd=REPO,
        env={**clean_env(runtime), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Refused(result.returncode, result.stdout, result.stderr, time.monotonic() - started)


def assert_refused(refused: Refused, code: int, line: str) -> None:
    """Exit ``code``, ``line`` alone on stderr, nothing started, no traceback, and fast."""
    assert refused.returncode == code, refused.output
    assert refused.stderr.splitlines() == [line], refused.output
    assert "Traceback" not in refused.output
    assert "starting Rollout Fleet" not in refused.output  # nothing was started
    assert refused.seconds < FAST_SECONDS, refused.seconds


@pytest.fixture
def syntax_error_agent(tmp_path: Path) -> tuple[str, str]:
    """An agent file that does not parse, and what Python says of it."""
    agent = tmp_path / "broken_agent.py"
    source = "def agent_loop(:\n    pass\n"
    agent.write_text(source)
    try:
        compile(source, agent.name, "exec")
    except SyntaxError as exc:
        return str(agent), str(exc)
    raise AssertionError("the source compiled")


BAD_AGENTS = {
    "missing file": (
        "main.py:nope",
        f"cannot load the agent 'main.py:nope': agent file '{REPO}/main.py' does not exist",
    ),
    "missing attribute": (
        "examples/calculator/server.py:nope",
        "cannot load the agent 'examples/calculator/server.py:nope': "
        "'examples/calculator/server.py' has no attribute 'nope'; available: ",
    ),
    "two colons": (
        "a:b:c",
        "cannot load the agent 'a:b:c': cannot import 'a:b': ModuleNotFoundError: "
        "No module named 'a:b'",
    ),
    "no attribute after the colon": (
        "examples/calculator/server.py:",
        "cannot load the agent 'examples/calculator/server.py:': invalid agent reference "
        "'examples/calculator/server.py:': expected module:attribute",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_AGENTS))
def test_an_agent_that_does_not_load_stops_up_before_it_starts_anything(
    tmp_path: Path, case: str
) -> None:
    agent, line = BAD_AGENTS[case]
    refused = run_up(tmp_path, "--agent", agent, "--no-flower")
    if case == "missing attribute":  # then the names the module has, to choose from
        assert refused.stderr.startswith(line), refused.output
        assert "agent_loop" in refused.stderr
        line = refused.stderr.rstrip("\n")
    assert_refused(refused, 1, line)


def test_an_agent_with_a_syntax_error_stops_up_with_pythons_words(
    tmp_path: Path, syntax_error_agent: tuple[str, str]
) -> None:
    path, says = syntax_error_agent
    refused = run_up(tmp_path, "--agent", f"{path}:agent_loop", "--no-flower")
    line = f"cannot load the agent '{path}:agent_loop': cannot import '{path}': SyntaxError: {says}"
    assert_refused(refused, 1, line)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--mock-trainer", "bogus"],
            "--mock-trainer 'bogus' is not a mock TrainGate responder: choose one of "
            "calculator, keyword",
        ),
        (
            ["--port", "80000"],
            "--port 80000 is not a port: choose one from 1 to 65535, or leave --port out to "
            "take a free one",
        ),
        (
            ["--flower-port", "0"],
            "--flower-port 0 is not a port: choose one from 1 to 65535, or leave --flower-port "
            "out to take a free one",
        ),
        (
            ["--gateway-workers", "0"],
            "--gateway-workers 0: give 1 or more gateway processes",
        ),
    ],
    ids=["unknown responder", "port out of range", "port 0", "no gateway process"],
)
def test_a_bad_option_stops_up_in_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    assert_refused(run_up(tmp_path, "--agent", CALCULATOR, *args), 2, line)


def test_an_invalid_setting_stops_up_in_one_line(tmp_path: Path) -> None:
    refused = run_up(
        tmp_path, "--agent", CALCULATOR, env={"OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "0"}
    )
    line = (
        "invalid setting OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS: Input should be greater than "
        "or equal to 1"
    )
    assert_refused(refused, 2, line)


@pytest.fixture
def redis_without_persistence(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server with ``appendonly no`` and ``save ""``: a restart forgets everything."""
    server = RedisServer(appendonly=False, data_dir=tmp_path / "redis").start()
    yield server
    server.stop()


def test_a_redis_that_keeps_nothing_stops_up_before_it_starts_anything(
    tmp_path: Path, redis_without_persistence: RedisServer
) -> None:
    refused = run_up(
        tmp_path, "--agent", CALCULATOR, env={"REDIS_URL": redis_without_persistence.url}
    )
    line = (
        "refusing to run: Redis can lose admitted rollouts: persistence is off (appendonly "
        "no, no save points), so a restart loses every admitted rollout (set appendonly yes). "
        "To run anyway, accepting the loss, set ROLLOUT_FLEET_ALLOW_REDIS_DATA_LOSS=true."
    )
    assert_refused(refused, 2, line)


def test_a_redis_that_does_not_answer_stops_up_without_its_password(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://:hunter2-secret@127.0.0.1:{port}/0"
    refused = run_up(tmp_path, "--agent", CALCULATOR, env={"REDIS_URL": url})
    line = (
        f"Redis at 127.0.0.1:{port}/0 does not answer: start it, fix REDIS_URL, or unset "
        "REDIS_URL to let rollout-fleet up run its own"
    )
    assert_refused(refused, 2, line)
    assert "hunter2" not in refused.output


def test_a_process_that_exits_during_start_stops_up_at_once_naming_why(tmp_path: Path) -> None:
    """An agent that loads in ``up`` (and the workers) but not in the gateway: ``up`` stops as
    soon as the gateway exits, with the gateway's last line and its log, stops the rest and
    says so last. Before, it waited 60 s and then blamed the gateway's readiness."""
    agent = agent_failing_in_the_gateway(tmp_path)
    reference = f"{agent}:agent_loop"
    started = time.monotonic()
    with started_up(tmp_path, "--agent", reference, "--no-flower", wait=False) as up:
        seen: set[psutil.Process] = set()
        while up.process.poll() is None:
            seen.update(up.tree())
            time.sleep(0.2)
        seconds = time.monotonic() - started
        output = up.output()
        assert up.process.returncode == 1, output
    folder = run_folder(output)
    line = (
        f"the fleet did not start: gateway exited with code 1: cannot load the agent "
        f"{reference!r}: cannot import '{agent}': RuntimeError: this agent does not load in "
        f"the gateway (its log: {folder / 'gateway.log'})"
    )
    assert line in output.splitlines(), output
    assert output.splitlines()[-1] == f"stopped (logs: {folder})"
    assert "Traceback" not in output
    assert "Traceback" not in (folder / "gateway.log").read_text()
    assert "timed out" not in output
    # The gateway's start, the import of the agent in it, then at once the rest stopped: well
    # under the 60 s the old wait took, even on a loaded machine.
    assert seconds < 55, seconds
    assert_all_gone(list(seen), set())


def test_up_with_a_server_key_becomes_ready_and_never_prints_the_key(tmp_path: Path) -> None:
    """``ROLLOUT_FLEET_API_KEY`` in the environment: the gateways require it, and ``up`` waits
    on them with it (it used to probe without, and time out on the 401s)."""
    key = "first-hour-server-key-0123"
    with started_up(tmp_path, *fleet_args(), env={"ROLLOUT_FLEET_API_KEY": key}) as up:
        output = up.output()
        gateway = output.split("gateway ✓ ", 1)[1].split()[0]
        assert httpx.get(f"{gateway}/ready", timeout=10).status_code == 401
        headers = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{gateway}/ready", headers=headers, timeout=10).status_code == 200
        assert "-H 'Authorization: Bearer <ROLLOUT_FLEET_API_KEY>'" in output
        tree = up.tree()
        ports = listening_ports(tree)

        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(60) == 0
        output = up.output()
        assert output.splitlines()[-1] == f"stopped (logs: {run_folder(output)})"
        assert key not in output
        assert_all_gone(tree, ports)
