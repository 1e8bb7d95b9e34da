"""The code examples of the seed documents 002, 003 and 004 run on the fleet
unmodified, through the ``osmosis_ai`` import alias, against the mock TrainGate. They are read
from the shared workspace (tests/seed_examples.py): 002 and 003 lost their line breaks when the
documents were captured, and only whitespace is restored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import V2FleetUnderTest
from tests.seed_examples import EXAMPLES, requires_seed_documents

pytestmark = requires_seed_documents


@requires_seed_documents
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_is_the_documents_code_but_for_whitespace(name: str) -> None:
    example = EXAMPLES[name]
    code = example.code(name).removeprefix(example.prelude)
    text = example.text()
    start = text.index(example.opening)
    tokens = "".join(code.split())
    assert "".join(text[start:].split())[: len(tokens)] == tokens
    compile(example.prelude + code, name, "exec")  # and it is Python


def run_example(
    start_fleet: StartFleet, seed_examples: dict[str, Path], name: str, **fields: Any
) -> dict[str, Any]:
    fleet = start_fleet(str(seed_examples[name]), workers=1, handle=V2FleetUnderTest, env=V2_ENV)
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        return fleet.run(**fields)
    finally:
        fleet.close()


PROSE = [{"role": "user", "content": "Tell me about Paris."}]


@pytest.mark.parametrize(
    ("name", "sample_id"),
    [
        ("002_example_search.py", "search-agent"),
        ("004_example_strands.py", "simple-strands-agent"),
        ("004_example_openai_agents.py", "simple-openai-agent"),
        ("004_example_tools.py", "search-agent"),
    ],
)
def test_framework_examples_run_and_produce_their_sample(
    start_fleet: StartFleet, seed_examples: dict[str, Path], name: str, sample_id: str
) -> None:
    final = run_example(start_fleet, seed_examples, name, initial_messages=PROSE, grade=False)
    assert final["status"] == "success", final
    messages = final["sample"]["messages"]
    assert messages, "the agent registered no conversation"
    assert any("OK." in str(message) for message in messages)  # the mock's answer


@pytest.mark.parametrize(
    "name",
    ["002_example_configurable.py", "004_example_base.py", "004_example_custom_config.py"],
)
def test_skeleton_examples_run(
    start_fleet: StartFleet, seed_examples: dict[str, Path], name: str
) -> None:
    final = run_example(start_fleet, seed_examples, name, initial_messages=PROSE, grade=False)
    assert (final["status"], final["sample"]) == ("success", None)  # they build no agent


def test_the_003_grader_reward_comes_back(
    start_fleet: StartFleet, seed_examples: dict[str, Path]
) -> None:
    path = seed_examples["003_example_multiply.py"]
    fleet = start_fleet(str(path), workers=1, handle=V2FleetUnderTest, env=V2_ENV)
    assert isinstance(fleet, V2FleetUnderTest)
    try:
        right = fleet.run(label="42")  # "What is 6 * 7?"
        wrong = fleet.run(label="41")
    finally:
        fleet.close()
    assert (right["status"], right["sample"]["reward"]) == ("success", 1.0)
    assert (wrong["status"], wrong["sample"]["reward"]) == ("success", 0.0)
