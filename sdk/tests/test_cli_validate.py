"""``rollout-sdk validate -m ...`` names each problem an agent can have, in both generations
(SDK.md §1.10 codes for v1 loops, §1.15 load errors, §2.7 discovery and ``validate_backend``
codes for v2 workflows), and exits 1; a sound agent of either generation passes."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_sdk.cli import app

V1_HEADER = """
from rollout_sdk import RolloutAgentLoop

class Loop(RolloutAgentLoop):
    name = {name}
    def get_tools(self, request):
        {tools}
    {run_def}(self, ctx):
        return ctx.complete([])
"""

V2_HEADER = """
from rollout_sdk import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig
"""


def v1_source(
    name: str = '"calc"', tools: str = "return []", run_def: str = "async def run"
) -> str:
    return V1_HEADER.format(name=name, tools=tools, run_def=run_def) + "\nagent_loop = Loop()\n"


def v2_source(body: str) -> str:
    return V2_HEADER + textwrap.dedent(body)


SOUND_WORKFLOW = """
class Solve(AgentWorkflow):
    async def run(self, ctx):
        return list(ctx.prompt)

class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)

config = AgentWorkflowConfig(name="solver")
"""


def validate(tmp_path: Path, source: str, attr: str | None = "agent_loop") -> tuple[int, str]:
    """Run the command in-process on ``source`` written to a fresh module."""
    module = f"agent_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(source)
    reference = str(tmp_path / f"{module}.py") + (f":{attr}" if attr else "")
    result = CliRunner().invoke(app, ["validate", "-m", reference])
    return result.exit_code, result.output


V1_CASES = {
    "INVALID_NAME_TYPE": v1_source(name="123"),
    "EMPTY_NAME": v1_source(name='"   "'),
    "GET_TOOLS_EXCEPTION": v1_source(tools="raise RuntimeError('tool registry is down')"),
    "GET_TOOLS_RETURNS_NONE": v1_source(tools="return None"),
    "GET_TOOLS_INVALID_TYPE": v1_source(tools="return {'type': 'function'}"),
    "INVALID_TOOL_TYPE": v1_source(tools="return ['add']"),
    "MISSING_TOOL_TYPE": v1_source(tools="return [{'function': {'name': 'add'}}]"),
    "MISSING_FUNCTION": v1_source(tools="return [{'type': 'function'}]"),
    "INVALID_FUNCTION_TYPE": v1_source(tools="return [{'type': 'function', 'function': 'add'}]"),
    "MISSING_FUNCTION_NAME": v1_source(
        tools="return [{'type': 'function', 'function': {'description': 'adds'}}]"
    ),
    "INVALID_FUNCTION_NAME": v1_source(
        tools="return [{'type': 'function', 'function': {'name': '', 'description': 'd'}}]"
    ),
    "INVALID_PARAMETERS_TYPE": v1_source(
        tools="return [{'type': 'function', 'function': {'name': 'add', 'description': 'd', "
        "'parameters': []}}]"
    ),
    "RUN_NOT_ASYNC": v1_source(run_def="def run"),
}


@pytest.mark.parametrize("code", sorted(V1_CASES))
def test_142_validate_names_each_v1_error(tmp_path: Path, code: str) -> None:
    exit_code, output = validate(tmp_path, V1_CASES[code])
    assert exit_code == 1, output
    assert "Agent loop validation failed with" in output
    assert f"[{code}]" in output


def test_142_v1_warnings_show_with_verbose_only(tmp_path: Path) -> None:
    source = v1_source(
        tools="return [{'type': 'function', 'function': {'name': 'add', "
        "'parameters': {'type': 'array'}}}]"
    )
    module = tmp_path / "warned_agent.py"
    module.write_text(source)
    quiet = CliRunner().invoke(app, ["validate", "-m", f"{module}:agent_loop"])
    loud = CliRunner().invoke(app, ["validate", "-m", f"{module}:agent_loop", "-v"])
    assert quiet.exit_code == loud.exit_code == 0
    assert "MISSING_FUNCTION_DESCRIPTION" not in quiet.output
    assert "[MISSING_FUNCTION_DESCRIPTION]" in loud.output
    assert "[PARAMETERS_TYPE_NOT_OBJECT]" in loud.output


V2_CASES = {
    "INVALID_AGENT_NAME": SOUND_WORKFLOW.replace('name="solver"', 'name="x" * 300'),
    "WORKFLOW_RUN_NOT_ASYNC": SOUND_WORKFLOW.replace(
        "    async def run(self, ctx):", "    def run(self, ctx):"
    ),
    "WORKFLOW_INIT_FAILED": SOUND_WORKFLOW.replace(
        "class Solve(AgentWorkflow):",
        "class Solve(AgentWorkflow):\n    def __init__(self, config=None):\n"
        "        raise ValueError('needs a model path')",
    ),
    "MISSING_GRADER": SOUND_WORKFLOW.split("class Exact", maxsplit=1)[0]
    + 'config = AgentWorkflowConfig(name="solver")\n',
    "GRADER_GRADE_NOT_ASYNC": SOUND_WORKFLOW.replace(
        "    async def grade(self, ctx):", "    def grade(self, ctx):"
    ),
    "GRADER_INIT_FAILED": SOUND_WORKFLOW.replace(
        "class Exact(Grader):",
        "class Exact(Grader):\n    def __init__(self, config=None):\n"
        "        raise KeyError('rubric')",
    ),
}


@pytest.mark.parametrize("code", sorted(V2_CASES))
def test_validate_names_each_v2_error(tmp_path: Path, code: str) -> None:
    exit_code, output = validate(tmp_path, v2_source(V2_CASES[code]), attr=None)
    assert exit_code == 1, output
    assert "Agent workflow validation failed with" in output
    assert f"[{code}]" in output


def test_validate_passes_sound_agents_of_both_generations(tmp_path: Path) -> None:
    exit_code, output = validate(tmp_path, v2_source(SOUND_WORKFLOW), attr=None)
    assert exit_code == 0, output
    assert "Agent workflow 'solver' validated successfully." in output
    assert "  - Grader: Exact" in output
    exit_code, output = validate(tmp_path, v1_source())
    assert exit_code == 0, output
    assert "Agent loop 'calc' validated successfully." in output


LOAD_CASES = {
    "no such file": ("", "missing.py:agent_loop", "does not exist"),
    "import failure": ("import not_a_real_package\n", None, "No module named"),
    "missing attribute": (v1_source(), "nope", "has no attribute 'nope'; available: Loop"),
    "wrong type": (v1_source() + "\nnumber = 7\n", "number", "is a int, not a RolloutAgentLoop"),
    "constructor failure": (
        v1_source()
        .replace(
            "    def get_tools",
            "    def __init__(self):\n        raise OSError('no GPU')\n    def get_tools",
        )
        .replace("agent_loop = Loop()", ""),
        "Loop",
        "cannot construct",
    ),
    "no workflow": ("x = 1\n", None, "No AgentWorkflow subclass found"),
    "two workflows": (
        v2_source(SOUND_WORKFLOW + "\nclass Other(Solve):\n    pass\n"),
        None,
        "Multiple AgentWorkflow subclasses found",
    ),
    "two graders": (
        v2_source(SOUND_WORKFLOW + "\nclass Lenient(Exact):\n    pass\n"),
        None,
        "Multiple Grader subclasses found",
    ),
    "two configs": (
        v2_source(SOUND_WORKFLOW + '\nother = AgentWorkflowConfig(name="b")\n'),
        None,
        "Multiple AgentWorkflowConfig instances found",
    ),
}


@pytest.mark.parametrize("case", sorted(LOAD_CASES))
def test_143_validate_explains_agents_it_cannot_load(tmp_path: Path, case: str) -> None:
    source, attr, message = LOAD_CASES[case]
    if case == "no such file":
        result = CliRunner().invoke(app, ["validate", "-m", str(tmp_path / attr)])
        exit_code, output = result.exit_code, result.output
    else:
        exit_code, output = validate(tmp_path, source, attr)
    assert exit_code == 1, output
    assert "Error: " in output
    assert message in output
