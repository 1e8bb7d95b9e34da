"""Agents written against upstream osmosis-ai run unchanged with the real ``osmosis-ai`` 0.3.8
installed beside us (as the workspace template's agents declare it).

A Python 3.12 venv holds our SDK (editable, from this checkout) and ``osmosis-ai==0.3.8`` from
PyPI; it is cached under ``test-output/`` keyed by the lock, so reruns are fast. In it:

* every name of every agent-facing ``__all__`` of the installed 0.3.8 wheel resolves through
  the alias (the names are read from the wheel's files, not from a hand-written list);
* template-shaped agents (OpenAI Agents and Strands workflows, a v1 ``RolloutAgentLoop``, the
  ``osmosis rollout init`` scaffold's shape), importing only from ``osmosis_ai``, pass
  ``rollout-sdk validate`` and ``rollout-sdk test`` against the mock TrainGate;
* the notice line that says the installed package was set aside is printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SDK = REPO / "sdk"
EXAMPLES = REPO / "examples"
UPSTREAM_VERSION = "0.3.8"
PYTHON_312 = ("/root/.pyenv/versions/3.12.1/bin/python3.12", "python3.12")
NOTICE = (
    f"rollout-sdk: osmosis_ai imports resolve to rollout_sdk, not to the installed osmosis-ai "
    f"{UPSTREAM_VERSION}; set ROLLOUT_SDK_OSMOSIS_ALIAS=upstream to use that package instead"
)
# Upstream modules that are not the SDK agents import: its command line and platform client
# (login, workspaces, templates, the eval command's LiteLLM bridge and tunnel) and the Harbor
# backend. docs/COMPATIBILITY.md ("The public API") says why each is left out.
NOT_AGENT_FACING = (
    "osmosis_ai.cli",
    "osmosis_ai.platform",
    "osmosis_ai.templates",
    "osmosis_ai.eval.local",
    "osmosis_ai.rollout.backend.harbor",
)
NETWORK_TROUBLE = ("dns error", "failed to fetch", "connection", "timed out", "network")

# Run inside the venv: every public module of the installed wheel and its ``__all__``, read
# from the files (ast, so nothing of upstream is imported; 3.12 syntax needs a 3.12 parser).
LIST_NAMES = """
import ast, json, pathlib, sys
from importlib.metadata import distribution
dist = distribution("osmosis-ai")
found = {}
for file in dist.files:
    if file.suffix != ".py" or not file.parts[0] == "osmosis_ai":
        continue
    module = ".".join(file.with_suffix("").parts).removesuffix(".__init__")
    if any(part.startswith("_") and part != "__init__" for part in file.with_suffix("").parts):
        continue
    for node in ast.parse(pathlib.Path(file.locate()).read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            found[module] = ast.literal_eval(node.value)
json.dump({"version": dist.version, "modules": found}, sys.stdout)
"""

# Run inside the venv: resolve each name through the alias; print what does not resolve.
RESOLVE = """
import importlib, json, sys
from rollout_sdk.compat import install_osmosis_alias
assert install_osmosis_alias()
wanted = json.load(sys.stdin)
missing = []
for module, names in wanted.items():
    try:
        imported = importlib.import_module(module)
    except Exception as exc:
        missing.append(f"{module}: {type(exc).__name__}: {exc}")
        continue
    missing += [f"{module}:{name}" for name in names if not hasattr(imported, name)]
import osmosis_ai, rollout_sdk
assert osmosis_ai is rollout_sdk, osmosis_ai
json.dump(missing, sys.stdout)
"""


def _python_312() -> str:
    for candidate in PYTHON_312:
        found = shutil.which(candidate)
        if found:
            return found
    pytest.skip("no Python 3.12 interpreter (upstream osmosis-ai needs Python >= 3.12)")


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("timeout", 600)
    return subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)


@pytest.fixture(scope="module")
def venv() -> Path:
    """The cached venv's directory (made once per lock and SDK pyproject)."""
    key = hashlib.sha256(
        (REPO / "uv.lock").read_bytes() + (SDK / "pyproject.toml").read_bytes()
    ).hexdigest()[:16]
    home = REPO / "test-output" / "upstream-venv" / f"{UPSTREAM_VERSION}-{key}"
    ready = home / ".ready"
    if ready.exists():
        return home
    shutil.rmtree(home, ignore_errors=True)
    made = _run(["uv", "venv", "--python", _python_312(), str(home)])
    assert made.returncode == 0, made.stderr
    installed = _run(
        [
            "uv", "pip", "install", "--python", str(home / "bin" / "python"),
            "-e", f"{SDK}[cli,server,strands,openai-agents]",
            f"osmosis-ai=={UPSTREAM_VERSION}",
        ],
        env={**os.environ, "UV_HTTP_TIMEOUT": "120"},
    )  # fmt: skip
    if installed.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        if any(word in installed.stderr.lower() for word in NETWORK_TROUBLE):
            pytest.skip(f"PyPI is unreachable: {installed.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"installing the venv failed:\n{installed.stderr}")
    ready.write_text(installed.stderr)
    return home


def test_each_module_left_out_is_documented() -> None:
    text = (REPO / "docs" / "COMPATIBILITY.md").read_text()
    for prefix in NOT_AGENT_FACING:
        assert f"`{prefix}`" in text, prefix


def _agent_facing(modules: dict[str, list[str]]) -> dict[str, list[str]]:
    return {
        module: names
        for module, names in modules.items()
        if not any(module == p or module.startswith(p + ".") for p in NOT_AGENT_FACING)
    }


def test_every_public_name_of_the_wheel_resolves_through_the_alias(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    listed = _run([python, "-c", LIST_NAMES])
    assert listed.returncode == 0, listed.stderr
    wheel = json.loads(listed.stdout)
    assert wheel["version"] == UPSTREAM_VERSION
    wanted = _agent_facing(wheel["modules"])
    # The wheel's layout as this test knows it: a new agent-facing module would show here.
    assert {"osmosis_ai", "osmosis_ai.rollout", "osmosis_ai.rollout.trajectory"} <= set(wanted)
    assert sum(len(names) for names in wanted.values()) == 96  # 0.3.8, 23 modules
    resolved = _run([python, "-c", RESOLVE], input=json.dumps(wanted))
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(resolved.stdout) == []
    assert resolved.stderr.strip().splitlines() == [NOTICE]


def _from_osmosis(text: str) -> str:
    """An example of ours as upstream's users write it: every import from ``osmosis_ai``."""
    text = text.replace("from rollout_sdk.integrations", "from osmosis_ai.rollout.integrations")
    text = text.replace("from rollout_sdk.core.exceptions", "from osmosis_ai.rollout.core")
    text = text.replace("from rollout_sdk.tools", "from osmosis_ai.rollout.tools")
    reward = "import osmosis_reward"
    text = text.replace(f"from rollout_sdk {reward}", f"from osmosis_ai {reward}")
    text = text.replace("from rollout_sdk import", "from osmosis_ai.rollout import")
    assert "rollout_sdk" not in text.split('"""', 2)[-1], text
    return text


SCAFFOLD = '''"""What `osmosis rollout init` scaffolds (osmosis-ai 0.3.8), TODOs filled in."""

from __future__ import annotations

import os
import re

import uvicorn

from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import (
    AgentWorkflowContext,
    GraderContext,
    SampleSource,
    get_rollout_context,
)
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import RolloutSample


class Conversation(SampleSource):
    def __init__(self, messages: list[dict]) -> None:
        self.messages = messages

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=self.messages)


class MyAgentWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        answer = {"role": "assistant", "content": "#### 96"}
        get_rollout_context().set_sample_source(Conversation([*ctx.prompt, answer]))


class MyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"].startswith("####") else 0.0)


def main() -> None:
    backend = LocalBackend(workflow=MyAgentWorkflow, grader=MyGrader)
    app = create_rollout_server(backend=backend)
    uvicorn.run(app, host="0.0.0.0", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """name → (the agent reference, its dataset), each agent in a folder of its own."""
    root = tmp_path_factory.mktemp("upstream-agents")
    made: dict[str, tuple[str, Path]] = {}
    for name, source, reference in (
        ("openai_agents", EXAMPLES / "openai_agents_multiply", "main.py"),
        ("strands", EXAMPLES / "strands_multiply", "main.py"),
        ("v1_loop", EXAMPLES / "calculator", "server.py:agent_loop"),
    ):
        folder = root / name
        folder.mkdir()
        for file in source.iterdir():
            if file.suffix == ".py":
                (folder / file.name).write_text(_from_osmosis(file.read_text()))
        shutil.copy(source / "test_data.jsonl", folder / "test_data.jsonl")
        made[name] = (reference, folder)
    scaffold = root / "scaffold"
    scaffold.mkdir()
    (scaffold / "main.py").write_text(SCAFFOLD)
    shutil.copy(EXAMPLES / "openai_agents_multiply" / "test_data.jsonl", scaffold)
    made["scaffold"] = ("main.py", scaffold)
    return made


def _cli(venv: Path, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.pop("ROLLOUT_SDK_OSMOSIS_ALIAS", None)
    return _run([str(venv / "bin" / "rollout-sdk"), *args], cwd=folder, env=env, timeout=300)


AGENTS = ["openai_agents", "strands", "v1_loop", "scaffold"]


@pytest.mark.parametrize("name", AGENTS)
def test_a_template_shaped_agent_validates(
    venv: Path, agents: dict[str, tuple[str, Path]], name: str
) -> None:
    reference, folder = agents[name]
    done = _cli(venv, folder, "validate", "-m", reference)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validated successfully" in done.stdout
    assert NOTICE in done.stderr.splitlines()


@pytest.mark.parametrize("name", AGENTS)
def test_a_template_shaped_agent_runs_against_the_mock_trainer(
    venv: Path,
    agents: dict[str, tuple[str, Path]],
    name: str,
    mock_trainer: tuple[str, Any],
    tmp_path: Path,
) -> None:
    reference, folder = agents[name]
    url, gate = mock_trainer
    out = tmp_path / "results.jsonl"
    done = _cli(
        venv, folder, "test", "-m", reference, "-d", "test_data.jsonl",
        "--base-url", f"{url}/v1/rollouts/{name}", "--model", "policy", "--limit", "2",
        "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert NOTICE in done.stderr.splitlines()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 2
    assert all(result["success"] and result["reward"] == 1.0 for result in results), results
    if name != "scaffold":  # the scaffold's workflow calls no model
        assert any(call.target == "chat" for call in gate.calls)


def test_upstream_mode_leaves_the_installed_package(
    venv: Path, agents: dict[str, tuple[str, Path]]
) -> None:
    reference, folder = agents["scaffold"]
    env = {**os.environ, "ROLLOUT_SDK_OSMOSIS_ALIAS": "upstream"}
    env.pop("VIRTUAL_ENV", None)
    done = _run(
        [str(venv / "bin" / "rollout-sdk"), "validate", "-m", reference],
        cwd=folder,
        env=env,
        timeout=300,
    )
    # Upstream's classes are not ours: discovery finds no workflow of ours, and says so.
    assert done.returncode == 1
    assert NOTICE not in done.stderr
    assert "AgentWorkflow" in done.stderr


def test_the_spec_says_what_the_newest_wheel_serves_about_drain(venv: Path) -> None:
    """PROTOCOL.md 2.14 says ``POST /drain`` is absent from 0.3.8 (it was in 0.3.5 only): the
    installed wheel's server code must define no such route."""
    site = next((venv / "lib").glob("python3.*/site-packages/osmosis_ai"))
    routes = [
        path.relative_to(site)
        for path in site.rglob("*.py")
        if re.search(r"""\.(post|api_route)\(\s*["']/drain["']""", path.read_text("utf-8"))
    ]
    assert routes == []
    spec = (REPO / "docs" / "spec" / "PROTOCOL.md").read_text()
    assert "added in 0.3.5, removed in 0.3.6, absent\nfrom 0.3.8" in spec
