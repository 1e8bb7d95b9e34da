"""The SDK's public surface: listed once per package (its ``__init__.pyi``), every listed name
resolves, and the generations' shared names mean what they must."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import rollout_sdk
from rollout_sdk import core, v1, v2

PACKAGES = [rollout_sdk, core, v1, v2]


def stub_names(package: ModuleType) -> list[str]:
    assert package.__file__ is not None
    stub = Path(package.__file__).with_suffix(".pyi")
    return [
        alias.asname or alias.name
        for node in ast.parse(stub.read_text()).body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.__name__)
def test_every_listed_name_resolves_and_is_listed_once(package: ModuleType) -> None:
    names = stub_names(package)
    assert len(names) == len(set(names)), "a name is listed twice"
    assert sorted(names) == package.__all__ == dir(package)
    for name in names:
        assert getattr(package, name) is not None, name
    with pytest.raises(AttributeError):
        _ = package.NoSuchName


def test_the_top_level_is_osmosis_compatible_and_v1_where_generations_share_a_name() -> None:
    from rollout_sdk.context import RolloutContext as AmbientContext
    from rollout_sdk.core.base import RolloutContext as AgentLoopContext
    from rollout_sdk.core.schemas import RolloutStatus as CallbackStatus
    from rollout_sdk.types import RolloutStatus as PollStatus

    assert rollout_sdk.RolloutContext is v1.RolloutContext is AgentLoopContext
    assert rollout_sdk.RolloutStatus is v1.RolloutStatus is CallbackStatus
    assert v2.RolloutContext is AmbientContext
    assert v2.RolloutStatus is PollStatus
    assert rollout_sdk.AgentWorkflow is v2.AgentWorkflow
    assert rollout_sdk.RolloutAgentLoop is v1.RolloutAgentLoop


def test_every_top_level_name_has_one_home() -> None:
    """A top-level name is the same object as in the generation namespace that holds it."""
    for name in rollout_sdk.__all__:
        homes = [ns for ns in (v1, v2) if name in ns.__all__]
        for namespace in homes:
            if name not in ("RolloutContext", "RolloutStatus", "MessageDict"):
                assert getattr(namespace, name) is getattr(rollout_sdk, name), name


def test_importing_the_sdk_and_its_namespaces_stays_light() -> None:
    code = (
        "import sys, rollout_sdk, rollout_sdk.core, rollout_sdk.v1, rollout_sdk.v2\n"
        "rollout_sdk.RolloutAgentLoop, rollout_sdk.v2.AgentWorkflow\n"
        "rollout_sdk.core.InitResponse, rollout_sdk.parse_tool_calls\n"
        "heavy = {'fastapi', 'uvicorn', 'strands', 'agents'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
