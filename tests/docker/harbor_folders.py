"""Harbor rollout folders for the sandbox tests, written fresh into a temporary folder (the
task and the oracle folder are bench/sandboxes.py's, which the benchmark runs too).

``write_template_rollout``: a folder shaped like the osmosis workspace
template's ``multiply-harbor-strands``: a project (``pyproject.toml``, its dependencies
``osmosis-ai[strands]`` and any others given) with a Strands ``AgentWorkflow`` and a
``Grader`` in a package, the task beside them without tests (the Grader is the verifier) and,
as the template's, without ``instruction.md`` (template mode takes it from the rollout), and a
``main.py`` that builds the backend and serves it in ``main()``.
``write_template_workspace``: that folder in a workspace shaped like the template's, with its
eval TOML (``configs/eval/multiply-harbor-strands.toml``) and a multiply dataset
(``data/multiply.jsonl``).
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.requirements import Requirement

from bench.sandboxes import write_task

WORKFLOW = '''\
"""Multiply two numbers with a Strands agent whose model is the rollout's policy."""

from typing import Any

from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.context import AgentWorkflowContext
from osmosis_ai.rollout.integrations.agents.strands import OsmosisRolloutModel, OsmosisStrandsAgent
from osmosis_ai.rollout.types import AgentWorkflowConfig
from strands import tool


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class MultiplyConfig(AgentWorkflowConfig):
    name: str = "multiply-harbor"
    model: Any
    tools: Any


multiply_workflow_config = MultiplyConfig(
    model=OsmosisRolloutModel(params={"temperature": 1.0, "max_tokens": 512}), tools=[multiply]
)


class MultiplyWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        config = ctx.config
        agent = OsmosisStrandsAgent(
            name="multiply",
            model=config.model,
            tools=config.tools,
            messages=ctx.prompt,
            callback_handler=None,
        )
        for _ in range(4):
            result = await agent.invoke_async()
            if not any("toolUse" in block for block in result.message.get("content", [])):
                break
'''

GRADER = '''\
"""Reward 1 when the last assistant message ends with the label as "#### n"."""

import re

from osmosis_ai.rollout.context import GraderContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.types import GraderConfig

ANSWER = re.compile(r"####\\s*(-?\\d+)")


class MultiplyGraderConfig(GraderConfig):
    name: str = "multiply-grader"


multiply_grader_config = MultiplyGraderConfig()


class MultiplyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        answer = None
        for message in reversed(list(ctx.sample.messages)):
            if message.get("role") == "assistant":
                content = message.get("content")
                text = content if isinstance(content, str) else "".join(
                    block.get("text", "") for block in content or []
                )
                found = ANSWER.search(text)
                answer = found.group(1) if found else None
                break
        ctx.set_reward(1.0 if answer is not None and answer == str(ctx.label) else 0.0)
'''

MAIN = """\
import logging
import os
from pathlib import Path

import uvicorn
from harbor.models.environment_type import EnvironmentType
from harbor.models.trial.config import EnvironmentConfig as HarborEnvironmentConfig
from harbor.trial.queue import TrialQueue

from multiply_rollout.grader import MultiplyGrader, multiply_grader_config
from multiply_rollout.workflow import MultiplyWorkflow, multiply_workflow_config
from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.server import create_rollout_server

logger = logging.getLogger(__name__)
ROLLOUT_DIR = Path(__file__).resolve().parent
ENVIRONMENT_TYPE = EnvironmentType.DOCKER
CONCURRENT_TRIALS = 8


def main() -> None:
    orchestrator = TrialQueue(n_concurrent=CONCURRENT_TRIALS)
    backend = HarborBackend(
        orchestrator=orchestrator,
        tasks_dir=ROLLOUT_DIR / "multiply_harbor_task",
        task_mode="template",
        agent=MultiplyWorkflow,
        workflow_config=multiply_workflow_config,
        grader=MultiplyGrader,
        grader_config=multiply_grader_config,
        code_dir=ROLLOUT_DIR,
        environment_config=HarborEnvironmentConfig(type=ENVIRONMENT_TYPE),
        cleanup_successful_trials=True,
    )
    app = create_rollout_server(backend=backend, lifespan=backend.prewarm_lifespan())
    port = int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000"))
    logger.info("Harbor rollout server starting on port %d", port)
    uvicorn.run(app, host="0.0.0.0", port=port)


if __name__ == "__main__":
    main()
"""

PYPROJECT = """\
[project]
name = "multiply-rollout"
version = "0.1.0"
requires-python = ">=3.12"
dependencies = {dependencies}

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["multiply_rollout"]
"""


TEMPLATE_DEPENDENCIES = ("osmosis-ai[strands]>=0.3.8",)


def write_template_rollout(folder: Path, dependencies: tuple[str, ...] = ()) -> Path:
    """The workspace-template-shaped folder, its project needing ``dependencies`` too; its
    main.py. A dependency's module (``cowsay>=6``: ``cowsay``) is imported by the workflow
    as it runs, so a rollout succeeds only where the sandbox has it."""
    package = folder / "multiply_rollout"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    modules = [Requirement(text).name.replace("-", "_") for text in dependencies]
    # Imported as the workflow runs: the sandbox has them, the worker's host need not.
    imports = "".join(f"        import {module}  # noqa: F401\n" for module in modules)
    run = "    async def run(self, ctx: AgentWorkflowContext) -> None:\n"
    (package / "workflow.py").write_text(WORKFLOW.replace(run, run + imports))
    (package / "grader.py").write_text(GRADER)
    wanted = json.dumps([*TEMPLATE_DEPENDENCIES, *dependencies])
    (folder / "pyproject.toml").write_text(PYPROJECT.format(dependencies=wanted))
    task = write_task(folder / "multiply_harbor_task", tests=False)
    (task / "instruction.md").unlink()
    (folder / "main.py").write_text(MAIN)
    return folder / "main.py"


# The workspace template's eval config for the folder, as it ships (its comments shortened).
EVAL_TOML = """\
# Multiply eval - Harbor Strands backend.
# Run locally: rollout-fleet eval run configs/eval/multiply-harbor-strands.toml

[experiment]
rollout = "multiply-harbor-strands"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"      # LiteLLM-style model name
dataset = "multiply"

[evaluation]
# limit = 200 # First N rows; local omit runs all.
n = 1
pass_threshold = 1.0
agent_workflow_timeout_s = 450
grader_timeout_s = 150

[secrets]
required = ["OPENAI_API_KEY"]
"""

# The template's system prompt; questions the mock TrainGate's calculator answers.
MULTIPLIER = (
    "\nYou are a helpful multiplier. You will be given two values and you need to output the "
    "product of them.\n\nOutput your solution on a new line with #### and the answer after "
    'it, like "#### {your answer}"\n'
)


def write_template_workspace(root: Path, questions: list[tuple[str, str]]) -> Path:
    """A workspace: the template-shaped rollout folder, its eval TOML, and ``questions``
    (``("12 * 8", "96")``: question and ground truth) as the dataset; the TOML's path."""
    write_template_rollout(root / "rollouts" / "multiply-harbor-strands")
    (root / "data").mkdir(parents=True)
    rows = [
        {"system_prompt": MULTIPLIER, "user_prompt": f"What is {question}?", "ground_truth": truth}
        for question, truth in questions
    ]
    (root / "data" / "multiply.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = root / "configs" / "eval" / "multiply-harbor-strands.toml"
    config.parent.mkdir(parents=True)
    config.write_text(EVAL_TOML)
    return config


PROBE_WORKFLOW = '''\
"""Try to connect to every address in metadata["probe"], then ask the policy once."""

import asyncio
import socket

import httpx
from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context


def connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


class ProbeWorkflow(AgentWorkflow):
    async def run(self, ctx):
        probes = (ctx.metadata or {}).get("probe", {})
        reached = {
            name: await asyncio.to_thread(connects, host, port)
            for name, (host, port) in probes.items()
        }
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=20) as http:
            answer = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                json={"model": "policy", "messages": ctx.prompt},
                headers={"Authorization": f"Bearer {rollout.api_key}"},
            )
        reply = answer.json()["choices"][0]["message"]
        metrics = {f"reached_{name}": float(ok) for name, ok in reached.items()}
        return AgentWorkflowOutput(messages=[*ctx.prompt, reply], metrics=metrics)


class AnsweredGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1].get("role") == "assistant" else 0.0)
'''

PROBE_MAIN = """\
from pathlib import Path

from harbor.trial.queue import TrialQueue

from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.server import create_rollout_server
from probe.workflow import AnsweredGrader, ProbeWorkflow

HERE = Path(__file__).resolve().parent
backend = HarborBackend(
    orchestrator=TrialQueue(n_concurrent=2),
    tasks_dir=HERE / "probe_task",
    agent=ProbeWorkflow,
    grader=AnsweredGrader,
    code_dir=HERE,
)
app = create_rollout_server(backend=backend)
"""


def write_probe_rollout(folder: Path) -> Path:
    """A workflow that reports which addresses it reached from its sandbox; its main.py."""
    package = folder / "probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "workflow.py").write_text(PROBE_WORKFLOW)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "probe"\nversion = "0"\ndependencies = ["osmosis-ai"]\n'
    )
    write_task(folder / "probe_task", tests=False)
    (folder / "main.py").write_text(PROBE_MAIN)
    return folder / "main.py"


__all__ = [
    "write_probe_rollout",
    "write_template_rollout",
    "write_template_workspace",
]
