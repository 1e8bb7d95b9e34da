"""Loading agents from ``module:attr`` and ``file.py:attr`` references."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_sdk import RolloutAgentLoop
from rollout_sdk.loader import AgentLoadError, load_agent_loop, split_reference

AGENT_SOURCE = """
from osmosis_ai.rollout import RolloutAgentLoop

class Echo(RolloutAgentLoop):
    name = "echo"
    def get_tools(self, request):
        return []
    async def run(self, ctx):
        return ctx.complete([])

agent_loop = Echo()
not_an_agent = 42
"""


@pytest.fixture
def agent_file(tmp_path: Path) -> Path:
    path = tmp_path / "echo_agent_mod.py"
    path.write_text(AGENT_SOURCE)
    return path


def test_split_reference() -> None:
    assert split_reference("a.b:c") == ("a.b", "c")
    assert split_reference("/x/y.py:agent") == ("/x/y.py", "agent")
    assert split_reference("mod") == ("mod", None)
    with pytest.raises(AgentLoadError, match="module:attribute"):
        split_reference("mod:")


def test_load_by_path_with_the_upstream_imports(agent_file: Path) -> None:
    loop = load_agent_loop(f"{agent_file}:agent_loop")
    assert isinstance(loop, RolloutAgentLoop)
    assert loop.name == "echo"


def test_load_by_path_discovers_the_single_instance(agent_file: Path) -> None:
    assert load_agent_loop(str(agent_file)).name == "echo"


def test_load_a_class_instantiates_it(agent_file: Path) -> None:
    assert load_agent_loop(f"{agent_file}:Echo").name == "echo"


def test_load_by_module_name(agent_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(agent_file.parent)
    assert load_agent_loop("echo_agent_mod:agent_loop").name == "echo"


def test_clear_errors(agent_file: Path) -> None:
    with pytest.raises(AgentLoadError, match=r"available: .*agent_loop"):
        load_agent_loop(f"{agent_file}:missing")
    with pytest.raises(AgentLoadError, match="int, not a RolloutAgentLoop"):
        load_agent_loop(f"{agent_file}:not_an_agent")
    with pytest.raises(AgentLoadError, match="cannot import 'no_such_module_xyz'"):
        load_agent_loop("no_such_module_xyz:agent")
    with pytest.raises(AgentLoadError, match="does not exist"):
        load_agent_loop(f"{agent_file.parent / 'nope.py'}:agent")


def test_an_unreadable_agent_says_which_uid_must_read_it(
    agent_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the fleet's images the process is uid 10001 and the agent a folder mounted from the
    host (tests/docker shows it for real); the error names the uid and the fix."""
    import os

    from rollout_sdk import loader

    def unreadable(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(loader, "_import_file", unreadable)
    with pytest.raises(AgentLoadError) as raised:
        load_agent_loop(f"{agent_file}:agent_loop")
    message = str(raised.value)
    assert "Permission denied" in message
    assert f"runs as uid {os.getuid()}" in message
    assert f"make {agent_file.parent} and its files readable by it" in message
    assert "chmod -R a+rX <folder>" in message
