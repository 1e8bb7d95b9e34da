"""The README stays true: its configuration table covers every fleet setting, and it keeps
exactly two quick-start commands (the `up` one is run by tests/operations/test_up_command)."""

from __future__ import annotations

from rollout_core.settings import FleetSettings
from tests.harness import REPO, quick_start_commands

README = (REPO / "README.md").read_text()


def test_two_quick_start_commands() -> None:
    assert quick_start_commands() == [
        quick_start_commands()[0],
        "uv run pytest",
    ]
    assert quick_start_commands()[0].startswith("uv run rollout-fleet up ")


def test_every_fleet_setting_is_documented() -> None:
    for name in FleetSettings.model_fields:
        assert f"ROLLOUT_FLEET_{name.upper()}" in README, name
