"""The ``osmosis_ai`` import alias (SDK.md "Naming"): upstream imports resolve to our modules."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator

import pytest

import rollout_sdk
from rollout_sdk.compat import (
    ALIAS_ENV,
    alias_target,
    install_osmosis_alias,
    uninstall_osmosis_alias,
)


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


def test_the_alias_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALIAS_ENV, "0")
    assert not install_osmosis_alias()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("osmosis_ai")


def test_a_real_osmosis_ai_package_wins(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "osmosis_ai"  # type: ignore[operator]
    package.mkdir()
    (package / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert not install_osmosis_alias()
        assert importlib.import_module("osmosis_ai").REAL is True
    finally:
        uninstall_osmosis_alias()
