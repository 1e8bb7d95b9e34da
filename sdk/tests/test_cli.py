"""CONFORMANCE §R items 142-145: ``rollout-sdk`` (alias ``osmosis``) validate and serve."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rollout_sdk.server.api_key import API_KEY_PREFIX

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = REPO / "examples" / "calculator"

BROKEN = """
from rollout_sdk import RolloutAgentLoop

class Broken(RolloutAgentLoop):
    name = "broken"
    def get_tools(self, request):
        raise RuntimeError("no tools")
    async def run(self, ctx):
        return ctx.complete([])

agent_loop = Broken()
"""


def cli(*args: str, cwd: Path = CALCULATOR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_sdk.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_142_validate_the_calculator() -> None:
    result = cli("validate", "-m", "server:agent_loop")
    assert result.returncode == 0, result.stderr
    assert "Agent loop 'calculator' validated successfully." in result.stdout
    assert "  - Tools: 2" in result.stdout


def test_142_validate_fails_on_a_raising_get_tools(tmp_path: Path) -> None:
    (tmp_path / "broken_agent.py").write_text(BROKEN)
    result = cli("validate", "-m", "broken_agent:agent_loop", cwd=tmp_path)
    assert result.returncode == 1
    assert "GET_TOOLS_EXCEPTION" in result.stdout


def test_143_bad_module_specs() -> None:
    no_colon = cli("validate", "-m", "nocolon")
    assert no_colon.returncode == 1
    assert "module.path:attribute" in no_colon.stderr
    missing = cli("validate", "-m", "server:missing")
    assert missing.returncode == 1
    assert "available:" in missing.stderr
    assert "agent_loop" in missing.stderr


def test_the_osmosis_console_script_is_installed() -> None:
    assert shutil.which("osmosis", path=os.path.dirname(sys.executable))
    assert shutil.which("rollout-sdk", path=os.path.dirname(sys.executable))


def _serve(port: int, *args: str, cwd: Path = CALCULATOR) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rollout_sdk.cli",
            "serve",
            "-m",
            "server:agent_loop",
            "-p",
            str(port),
            "-H",
            "127.0.0.1",
            *args,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_up(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError(url)


@pytest.fixture
def port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free: int = sock.getsockname()[1]
        return free


def test_144_serve_local_has_no_auth(port: int) -> None:
    server = _serve(port, "--local")
    try:
        _wait_up(f"http://127.0.0.1:{port}/health")
        body = {
            "rollout_id": "x",
            "server_url": "http://127.0.0.1:1",
            "messages": [],
            "completion_params": {},
        }
        assert httpx.post(f"http://127.0.0.1:{port}/v1/rollout/init", json=body).status_code == 202
    finally:
        server.terminate()
        server.wait(10)


def test_144_serve_without_a_key_generates_and_requires_one(port: int) -> None:
    server = _serve(port)
    try:
        _wait_up(f"http://127.0.0.1:{port}/health")
        assert server.stdout is not None
        line = next(line for line in server.stdout if "API key" in line)
        key = line.split()[-1]
        assert key.startswith(API_KEY_PREFIX)
        assert len(key) == len(API_KEY_PREFIX) + 43
        url = f"http://127.0.0.1:{port}/platform/health"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    finally:
        server.terminate()
        server.wait(10)


def test_145_serve_log_writes_traces_under_a_timestamp_dir(
    port: int, tmp_path: Path, serve: object, mock_trainer: tuple[str, object]
) -> None:
    trainer, _ = mock_trainer
    server = _serve(port, "--local", "--log", str(tmp_path / "logs"))
    try:
        _wait_up(f"http://127.0.0.1:{port}/health")
        body = {
            "rollout_id": "trace-me",
            "server_url": trainer,
            "messages": [{"role": "user", "content": "What is 2 + 2?"}],
            "completion_params": {},
            "metadata": {"ground_truth": "4"},
        }
        assert httpx.post(f"http://127.0.0.1:{port}/v1/rollout/init", json=body).status_code == 202
        deadline = time.monotonic() + 20
        traces: list[Path] = []
        while not traces and time.monotonic() < deadline:
            traces = list((tmp_path / "logs").glob("*/trace-me.jsonl"))
            time.sleep(0.1)
        assert traces, "no trace written"
        assert traces[0].parent.name.isdigit()
        time.sleep(0.5)
        events = [json.loads(line)["event"] for line in traces[0].read_text().splitlines()]
        assert events[0] == "pre_llm"
        assert events[-1] == "rollout_complete"
    finally:
        server.terminate()
        server.wait(10)
