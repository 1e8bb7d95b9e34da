"""``rollout-fleet flower`` never serves the dashboard without a login."""

from __future__ import annotations

import os
import subprocess

from rollout_fleet.local import fleet_command


def test_flower_refuses_to_start_without_a_login() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    argv = fleet_command("flower", "--port", "1")
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "set FLOWER_BASIC_AUTH=user:password" in result.stdout
