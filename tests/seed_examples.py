"""The seed documents' code examples, taken from the shared workspace at test time.

The user-facing documents the SDK must match live in ``../shared/reference/`` (CI has them);
the repo holds none of their text. Each example is located in its document by the first
characters of its code and its length. Documents 002 and 003 lost their line breaks when they
were captured: ``agents/seed_layout.json`` restores only whitespace (offset in the example,
characters replaced, the whitespace that stood there), so every other character is the
document's. Tests that run the examples skip, saying why, when the documents are absent.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import REPO

SHARED = REPO.parent / "shared" / "reference"
AGENTS = REPO / "tests" / "agents"
LAYOUT = json.loads((AGENTS / "seed_layout.json").read_text())

requires_seed_documents = pytest.mark.skipif(
    not SHARED.is_dir(),
    reason=f"the seed documents are not here ({SHARED}): the shared workspace sits next to "
    "the clone in CI and in development; a lone clone cannot run their examples",
)

# The quick-start snippet of 001 has no import lines and relies on two modules of the
# project layout it describes: ours, beside it (agents/seed_001/).
SNIPPET_IMPORTS = """\
from osmosis_ai.rollout import (
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
    create_app,
)
from rewards import compute_reward
from tools import CALCULATOR_TOOL_SCHEMAS, execute_tools

"""


@dataclass(frozen=True)
class Example:
    document: str
    opening: str  # the first characters of the example's code in the document
    length: int = 0  # its length there, in characters (from the layout when restored)
    prelude: str = ""  # lines of ours put before it
    support: str = ""  # a folder of ours whose modules it imports

    def text(self) -> str:
        return (SHARED / self.document).read_text()

    def code(self, name: str) -> str:
        """The example's code: the document's characters, with lost whitespace restored."""
        text = self.text()
        assert text.count(self.opening) == 1, f"{name}: its opening is not unique in the document"
        start = text.index(self.opening)
        layout = LAYOUT.get(name, {"length": self.length, "edits": []})
        segment = text[start : start + layout["length"]]
        pieces, position = [], 0
        for offset, replaced, whitespace in layout["edits"]:
            assert segment[offset : offset + replaced].isspace() or not replaced
            pieces += [segment[position:offset], whitespace]
            position = offset + replaced
        return self.prelude + "".join([*pieces, segment[position:]])


D000 = "000_b9545de456cc06aa.txt"
D001 = "001_50f9b5c86b47165d.txt"
D002 = "002_d2a56acf379bdbc2.txt"
D003 = "003_0a149eff60aaf400.txt"
D004 = "004_c0db105f2916056e.txt"

# name → where it is: the example file name is <document>_<example>.py
EXAMPLES = {
    "000_server.py": Example(D000, "import time\nfrom typing import List, Dict", 5151),
    "001_server.py": Example(
        D001, "class CalculatorAgentLoop(RolloutAgentLoop):", 746, SNIPPET_IMPORTS, "seed_001"
    ),
    "002_example_search.py": Example(D002, "from typing import Anyfrom strands"),
    "002_example_configurable.py": Example(
        D002,
        "from osmosis_ai.rollout import ( AgentWorkflow, AgentWorkflowConfig, "
        "AgentWorkflowContext,)class MyConfig",
    ),
    "003_example_multiply.py": Example(D003, "from agents import ModelSettings, Runner, function"),
    "004_example_base.py": Example(
        D004, "from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext\n\n\nclass", 216
    ),
    "004_example_strands.py": Example(
        D004,
        "from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext\n"
        "from osmosis_ai.rollout.integrations.agents.strands",
        545,
    ),
    "004_example_openai_agents.py": Example(
        D004, "from agents import ModelSettings, Runner\n", 786
    ),
    "004_example_custom_config.py": Example(
        D004,
        "from osmosis_ai.rollout import (\n    AgentWorkflow,\n    AgentWorkflowConfig,\n"
        "    AgentWorkflowContext,\n    ConcurrencyConfig,",
        735,
    ),
    "004_example_tools.py": Example(
        D004, "from typing import Any\n\nfrom strands import tool", 1286
    ),
}


def write_examples(directory: Path) -> dict[str, Path]:
    """Each example as a file of its own folder (with its support modules beside it)."""
    written = {}
    for name, example in EXAMPLES.items():
        folder = directory / name.removesuffix(".py")
        folder.mkdir(parents=True, exist_ok=True)
        if example.support:
            shutil.copytree(AGENTS / example.support, folder, dirs_exist_ok=True)
        written[name] = folder / "example.py"
        written[name].write_text(example.code(name))
    return written


__all__ = ["EXAMPLES", "SHARED", "requires_seed_documents", "write_examples"]
