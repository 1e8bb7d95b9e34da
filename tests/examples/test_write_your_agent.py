"""docs/WRITE-YOUR-AGENT.md stays true: its code runs, its commands work, its flags exist.

The guide marks what it asks the reader to do: ``<!-- file: PATH -->`` before a code block
that is a file to save at PATH, ``<!-- run -->`` before a shell block to run from the
repository's root. Here every Python block compiles, a file block under ``examples/`` is that
file to the letter, every flag a command passes is one the command has, and the whole walk
through (each file written, each marked command run in order, in a scratch folder standing in
for the root) passes against the mock TrainGate: every row validated, tested and evaluated
earns its reward. The guide's mock TrainGate listens on its default port; the test's on a
free one, so that address is the one thing swapped.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, MockTrainGateClient

GUIDE = REPO / "docs" / "WRITE-YOUR-AGENT.md"
GUIDE_MOCK_URL = "http://127.0.0.1:9001"  # where `rollout-sdk mock-trainer` listens by default
BIN = Path(sys.executable).parent  # the project's environment: what `uv run` runs in
MARKER = re.compile(r"<!-- (file: (?P<path>\S+)|run) -->")


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # where its fence opens
    path: str | None = None  # a file to save
    run: bool = False  # commands to run

    @property
    def where(self) -> str:
        return f"{GUIDE.name}:{self.line}"


def blocks(text: str) -> list[Block]:
    """Every fenced block, with the marker on the line before it (blank lines skipped)."""
    found, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = re.fullmatch(r"```(\w*)", lines[index])
        if opening is None:
            index += 1
            continue
        end = lines.index("```", index + 1)
        before = [line for line in lines[:index] if line.strip()]
        marker = MARKER.fullmatch(before[-1]) if before else None
        found.append(
            Block(
                language=opening[1],
                code="\n".join(lines[index + 1 : end]) + "\n",
                line=index + 1,
                path=marker["path"] if marker else None,
                run=marker is not None and marker["path"] is None,
            )
        )
        index = end + 1
    return found


def commands(block: Block) -> Iterator[list[str]]:
    """A shell block's commands, continuation lines joined, split as the shell would."""
    for command in block.code.replace("\\\n", " ").splitlines():
        if command.strip() and not command.lstrip().startswith("#"):
            yield shlex.split(command)


GUIDE_BLOCKS = blocks(GUIDE.read_text())


def of(language: str) -> list[Block]:
    return [block for block in GUIDE_BLOCKS if block.language == language]


def run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """One command as the guide gives it; ``uv run X`` is X from the project's environment."""
    if argv[:2] == ["uv", "run"]:
        argv = [str(BIN / argv[2]), *argv[3:]]
    else:
        assert argv[0] in ("mkdir", "cp"), f"the guide runs {argv[0]}: teach this test about it"
    return subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_the_guide_has_what_it_promises() -> None:
    """v1, plain v2 twice, Strands and OpenAI Agents; an eval config; commands to run."""
    assert len(of("python")) == 5
    assert {block.path for block in of("python")} == {
        "my_v1/server.py",
        "examples/plain_v2_calculator/main.py",
        "my_httpx/main.py",
        "my_strands/main.py",
        "my_openai_agents/main.py",
    }
    assert [block.path for block in of("toml")] == ["my_evals/configs/eval/calculator.toml"]
    assert sum(block.run for block in GUIDE_BLOCKS) >= 7


@pytest.mark.parametrize("block", of("python"), ids=lambda block: block.where)
def test_every_python_block_compiles(block: Block) -> None:
    compile(block.code, block.where, "exec")


def test_a_block_showing_a_repo_file_is_that_file() -> None:
    shown = [block for block in GUIDE_BLOCKS if block.path and block.path.startswith("examples/")]
    assert shown
    for block in shown:
        assert block.code == (REPO / block.path).read_text(), f"{block.where}: {block.path}"


def test_json_and_toml_blocks_parse_and_the_row_shown_is_in_its_dataset() -> None:
    rows = {
        line
        for dataset in (REPO / "examples").glob("*/test_data.jsonl")
        for line in dataset.read_text().splitlines()
    }
    for block in of("json"):
        json.loads(block.code)
        assert block.code.strip() in rows, block.where
    for block in of("toml"):
        tomllib.loads(block.code)


@functools.cache
def help_text(words: tuple[str, ...]) -> str:
    done = run(["uv", "run", *words, "--help"], REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def help_of(argv: list[str]) -> str:
    """``--help`` of the (sub)command ``argv`` names: the program and its leading words."""
    words = [argv[2]]
    for word in argv[3:5]:
        if word.startswith("-") or "/" in word or "." in word:
            break
        words.append(word)
    return help_text(tuple(words))


def unknown_flags(argv: list[str]) -> list[str]:
    text = help_of(argv)
    flags = [token.split("=")[0] for token in argv if token.startswith("-")]
    return [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]


def test_every_flag_the_guide_passes_is_one_its_command_has() -> None:
    checked = 0
    for block in of("bash"):
        for argv in commands(block):
            if argv[:2] == ["uv", "run"] and argv[2].startswith("rollout-"):
                assert unknown_flags(argv) == [], f"{block.where}: {shlex.join(argv)}"
                checked += 1
    assert checked >= 10
    mock = help_of(["uv", "run", "rollout-sdk", "mock-trainer"])
    assert re.search(r"--port .*\[default: 9001\]", mock)  # the port the guide's URLs use


def test_a_flag_a_command_lacks_is_caught() -> None:
    argv = ["uv", "run", "rollout-sdk", "test", "-m", "x.py", "--base-urls", "u", "-d", "r"]
    assert unknown_flags(argv) == ["--base-urls"]


def write_files(workspace: Path, url: str) -> None:
    """The files the guide asks for (those under examples/ are the repo's, linked)."""
    (workspace / "examples").symlink_to(REPO / "examples")
    for block in GUIDE_BLOCKS:
        if block.path and not block.path.startswith("examples/"):
            target = workspace / block.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code.replace(GUIDE_MOCK_URL, url))


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def check_rows(results: Path, where: str) -> None:
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert rows, where
    for row in rows:
        assert row["status"] in ("COMPLETED", "success"), f"{where}: {row}"
        assert row["reward"] == 1.0, f"{where}: {row}"


def check_eval(run_dir: Path, where: str) -> None:
    metrics: dict[str, Any] = json.loads((run_dir / "metrics.json").read_text())
    policy = metrics["models"]["policy"]
    assert policy["finished"] == policy["items"] > 0, f"{where}: {policy}"
    assert (policy["failed"], policy["mean_reward"]) == (0, 1.0), f"{where}: {policy}"
    assert (run_dir / "results.jsonl").is_file()
    assert (run_dir / "report.html").is_file()


def test_the_walk_through_runs_against_the_mock_traingate(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    write_files(tmp_path, mock_trainer.url)
    ran: list[str] = []
    for block in (block for block in GUIDE_BLOCKS if block.run):
        for number, given in enumerate(commands(block)):
            argv = [token.replace(GUIDE_MOCK_URL, mock_trainer.url) for token in given]
            where = f"{block.where} command {number + 1}"
            results = tmp_path / f"results-{block.line}-{number}.jsonl"
            if argv[2:4] == ["rollout-sdk", "test"]:
                argv += ["-o", str(results)]  # what each row earned
            done = run(argv, tmp_path)
            assert done.returncode == 0, f"{where}: {shlex.join(argv)}\n{done.stdout}"
            if argv[3:4] == ["validate"]:
                assert "validated successfully" in done.stdout, where
            if argv[3:4] == ["test"]:
                check_rows(results, where)
            if argv[3:5] == ["eval", "run"]:
                check_eval(tmp_path / ".rollout-fleet" / "evals" / option(argv, "--name"), where)
            ran.append(shlex.join(argv[2:5]))
    assert ran.count("rollout-sdk validate -m") == 5
    assert sum(command.startswith("rollout-sdk test") for command in ran) == 5
    assert sum(command.startswith("rollout-fleet eval run") for command in ran) == 2


def test_the_walk_through_would_catch_a_broken_agent(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    """The check above can fail: a grader that scores nothing fails its rows."""
    write_files(tmp_path, mock_trainer.url)
    module = tmp_path / "my_httpx" / "main.py"
    module.write_text(module.read_text().replace("1.0 if right else 0.0", "0.0"))
    results = tmp_path / "results.jsonl"
    argv = ["uv", "run", "rollout-sdk", "test", "-m", "my_httpx/main.py"]
    argv += ["-d", "examples/plain_v2_calculator/test_data.jsonl", "-o", str(results)]
    run([*argv, "--base-url", f"{mock_trainer.url}/v1/rollouts/broken"], tmp_path)
    with pytest.raises(AssertionError, match=re.escape("'reward': 0.0")):
        check_rows(results, "broken")


def test_the_guide_is_linked_from_the_readme_and_the_sdk_spec() -> None:
    assert "(docs/WRITE-YOUR-AGENT.md)" in (REPO / "README.md").read_text()
    assert "(../WRITE-YOUR-AGENT.md)" in (REPO / "docs" / "spec" / "SDK.md").read_text()
