"""The ``osmosis_ai`` import alias (SDK.md "Naming"): upstream imports resolve to our modules."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import rollout_sdk
from rollout_sdk.compat import (
    ALIAS_ENV,
    AliasSettingError,
    alias_target,
    install_osmosis_alias,
    uninstall_osmosis_alias,
)
from rollout_sdk.loader import AgentLoadError, import_agent_module


@pytest.fixture(autouse=True)
def no_alias_yet() -> None:
    """Each test starts without the alias: loading an agent elsewhere in the session installs
    it for the whole process."""
    uninstall_osmosis_alias()


@pytest.fixture
def alias() -> Iterator[None]:
    assert install_osmosis_alias()
    yield
    uninstall_osmosis_alias()


def test_names_map_onto_rollout_sdk() -> None:
    assert alias_target("osmosis_ai") == "rollout_sdk"
    assert alias_target("osmosis_ai.rollout") == "rollout_sdk"
    assert alias_target("osmosis_ai.rollout.core.schemas") == "rollout_sdk.core.schemas"
    assert alias_target("osmosis_ai.rollout.tools") == "rollout_sdk.tools"
    assert alias_target("osmosis_aix") is None
    assert alias_target("osmosis_ai.eval") == "rollout_sdk.rubric"
    assert alias_target("osmosis_ai.eval.rubric.types") == "rollout_sdk.rubric.types"
    assert alias_target("osmosis_ai.rollout.trajectory") == "rollout_sdk.trajectory"


@pytest.mark.usefixtures("alias")
def test_upstream_imports_give_the_same_objects() -> None:
    from osmosis_ai import osmosis_reward
    from osmosis_ai.rollout import RolloutAgentLoop, create_app
    from osmosis_ai.rollout.core.schemas import OpenAIFunctionToolSchema
    from osmosis_ai.rollout.tools import get_tool_call_info

    from rollout_sdk.core.schemas import OpenAIFunctionToolSchema as Ours
    from rollout_sdk.server.app import create_app as our_create_app

    assert RolloutAgentLoop is rollout_sdk.RolloutAgentLoop
    assert OpenAIFunctionToolSchema is Ours
    assert get_tool_call_info is rollout_sdk.get_tool_call_info
    assert osmosis_reward is rollout_sdk.osmosis_reward
    assert create_app is our_create_app
    assert sys.modules["osmosis_ai.rollout.core.schemas"] is sys.modules["rollout_sdk.core.schemas"]
    # The shared module keeps its own identity.
    assert sys.modules["rollout_sdk.core.schemas"].__spec__.name == "rollout_sdk.core.schemas"  # type: ignore[union-attr]


def test_importing_the_alias_does_not_import_fastapi() -> None:
    code = (
        "import sys; from rollout_sdk.compat import install_osmosis_alias; install_osmosis_alias();"
        "import osmosis_ai, osmosis_ai.rollout; from osmosis_ai.rollout import RolloutAgentLoop;"
        "assert 'fastapi' not in sys.modules, 'fastapi imported'"
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("value", ["off", "0", "upstream"])
def test_the_alias_can_be_switched_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ALIAS_ENV, value)
    assert not install_osmosis_alias()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("osmosis_ai")


def test_a_value_that_is_no_mode_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALIAS_ENV, "yes")
    with pytest.raises(AliasSettingError) as caught:
        install_osmosis_alias()
    assert str(caught.value) == (
        "ROLLOUT_SDK_OSMOSIS_ALIAS='yes' is not a choice: set it to ours (the default: "
        "osmosis_ai imports give rollout_sdk), upstream (the installed osmosis-ai package) or off"
    )
    with pytest.raises(AgentLoadError, match=r"^ROLLOUT_SDK_OSMOSIS_ALIAS='yes' is not a choice"):
        import_agent_module("json")


@pytest.fixture
def real_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A stand-in for an installed ``osmosis_ai`` (already imported, as a framework might)."""
    package = tmp_path / "osmosis_ai"
    package.mkdir()
    (package / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("osmosis_ai")
    yield
    uninstall_osmosis_alias()


@pytest.mark.usefixtures("real_package")
def test_ours_displaces_an_installed_package_with_one_notice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="rollout_sdk.compat"):
        assert install_osmosis_alias()
        assert install_osmosis_alias()  # once per process
    assert [r.getMessage() for r in caplog.records] == [
        "rollout-sdk: osmosis_ai imports resolve to rollout_sdk, not to the installed "
        "osmosis-ai unknown; set ROLLOUT_SDK_OSMOSIS_ALIAS=upstream to use that package instead"
    ]
    imported = importlib.import_module("osmosis_ai")
    assert imported is rollout_sdk
    assert not hasattr(imported, "REAL")


@pytest.mark.usefixtures("real_package")
def test_upstream_keeps_the_installed_package(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(ALIAS_ENV, "upstream")
    assert not install_osmosis_alias()
    assert importlib.import_module("osmosis_ai").REAL is True
    assert not caplog.records


def test_upstream_without_the_package_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ALIAS_ENV, "upstream")
    agent = tmp_path / "needs_upstream.py"
    agent.write_text("from osmosis_ai.rollout import AgentWorkflow\n")
    with pytest.raises(AgentLoadError) as caught:
        import_agent_module(str(agent))
    assert str(caught.value) == (
        f"cannot import {str(agent)!r}: No module named 'osmosis_ai'; ROLLOUT_SDK_OSMOSIS_ALIAS "
        "chooses the installed osmosis-ai package and it has no such module: install it, or "
        "unset ROLLOUT_SDK_OSMOSIS_ALIAS to run the agent on rollout_sdk"
    )


def test_the_cli_names_a_wrong_setting_before_the_agent(tmp_path: Path) -> None:
    import os
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "rollout_sdk.cli", "validate", "-m", "main.py"],
        cwd=tmp_path,
        env={**os.environ, ALIAS_ENV: "bogus"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "Error: ROLLOUT_SDK_OSMOSIS_ALIAS='bogus' is not a choice: set it to ours (the "
        "default: osmosis_ai imports give rollout_sdk), upstream (the installed osmosis-ai "
        "package) or off"
    ]
