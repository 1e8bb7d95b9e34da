"""CONFORMANCE §O item 122: the *reference* trainer client (``osmosis-ai`` 0.3.8, which needs
Python ≥ 3.12) runs a rollout on the fleet and its ``wait_idle()`` succeeds.

The client runs in its own virtual environment (cached between runs) so the real
``osmosis_ai`` package never shadows the fleet's import alias.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.upstream import python_312
from tests.conftest import v2_fleet
from tests.harness import V2FleetUnderTest, new_id

REFERENCE = "osmosis-ai==0.3.8"
# Installed without its dependency pins (0.3.8 pins a certifi newer than the package index
# here has); these are all its trainer client imports.
CLIENT_DEPENDENCIES = ["httpx", "pydantic", "anyio", "python-dotenv"]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollout-fleet-tests"

fleet = v2_fleet()

CLIENT_SCRIPT = """
import asyncio, json, sys
from osmosis_ai.rollout.client import RolloutClient

async def main(gateway, trainer, rollout_id):
    client = RolloutClient(url=gateway)
    result = await client.run_rollout(
        initial_messages=[{"role": "user", "content": "What is 6 * 7?"}],
        chat_completions_url=f"{trainer}/v1/rollouts/{rollout_id}",
        rollout_id=rollout_id,
        label="42",
    )
    health = await client.wait_idle(timeout_sec=60, poll_interval_sec=0.2)
    await client.aclose()
    print(json.dumps({
        "status": str(result.status.value),
        "reward": result.sample.reward if result.sample else None,
        "active": health["lifecycle"]["active_rollouts"],
    }))

asyncio.run(main(*sys.argv[1:4]))
"""


@pytest.fixture(scope="module")
def reference_python() -> Path:
    venv = CACHE / REFERENCE.replace("==", "-")
    python = venv / "bin" / "python"
    if not python.exists():
        interpreter, uv = python_312(), shutil.which("uv")
        if interpreter is None or uv is None:
            pytest.skip(f"{REFERENCE} needs Python >= 3.12 and uv; this machine has neither")
        subprocess.run([uv, "venv", "-q", "-p", interpreter, str(venv)], check=True)
        install = [uv, "pip", "install", "-q", "--python", str(python)]
        subprocess.run([*install, "--no-deps", REFERENCE], check=True)
        subprocess.run([*install, *CLIENT_DEPENDENCIES], check=True)
    return python


def test_122_the_reference_client_runs_a_rollout_and_waits_idle(
    fleet: V2FleetUnderTest, reference_python: Path
) -> None:
    rollout_id = new_id("reference-client")
    completed = subprocess.run(
        [
            str(reference_python),
            "-c",
            CLIENT_SCRIPT,
            fleet.fleet.gateway_url,
            fleet.trainer.url,
            rollout_id,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == {
        "status": "success",
        "reward": 1.0,
        "active": 0,
    }
