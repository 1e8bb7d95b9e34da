"""The eval TOML: upstream's file read unchanged, refused with upstream's words when it is
wrong, plus our ``[model]`` and ``[fleet]`` sections (no processes but the CLI's own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollout_sdk.evaluation.config import EvalConfigError, load_eval_config

GOOD = """
[experiment]
rollout = "multiply"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "rows.jsonl"
commit_sha = "0123abc"

[evaluation]
limit = 4
n = 3
batch_size = 2
pass_threshold = 1
agent_workflow_timeout_s = 60
grader_timeout_s = 30

[env]
CALC_MODE = "strict"

[secrets]
required = ["EVAL_TEST_SECRET"]

[advanced]
anything = { goes = true }

[model]
base_url = "http://127.0.0.1:9/v1"
api_key_env = "MY_KEY"

[fleet]
workers = 3
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """Upstream's layout: rollouts/<name>/<entrypoint>, configs/eval/, a dataset."""
    (tmp_path / "rollouts" / "multiply").mkdir(parents=True)
    (tmp_path / "rollouts" / "multiply" / "main.py").write_text("# the agent\n")
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    (tmp_path / "rows.jsonl").write_text('{"user_prompt": "What is 2 * 3?"}\n')
    return tmp_path


def config_file(workspace: Path, text: str) -> Path:
    path = workspace / "configs" / "eval" / "run.toml"
    path.write_text(text)
    return path


def test_upstreams_file_is_read_with_our_sections(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace / "configs")
    config = load_eval_config(config_file(workspace, GOOD))
    assert config.agent == str(workspace / "rollouts" / "multiply" / "main.py")
    assert config.dataset.resolve() == (workspace / "rows.jsonl").resolve()
    assert (config.limit, config.n, config.batch_size, config.pass_threshold) == (4, 3, 2, 1.0)
    assert (config.agent_timeout_s, config.grader_timeout_s) == (60.0, 30.0)
    assert config.model.model == "gpt-5-mini"  # LiteLLM's provider prefix dropped
    assert (config.model.base_url, config.model.api_key_env) == ("http://127.0.0.1:9/v1", "MY_KEY")
    assert (config.fleet.workers, config.fleet.gateway_url) == (3, None)
    assert config.env == {"CALC_MODE": "strict"}
    assert config.secrets == ("EVAL_TEST_SECRET",)
    assert config.advanced == {"anything": {"goes": True}}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda t: t + "\n[bogus]\nx = 1\n",
            "Invalid eval config:\n  - bogus: Unrecognized section",
        ),
        (lambda t: t.replace("n = 3", "nn = 3"), "  - evaluation.nn: Unrecognized key"),
        (
            lambda t: t.replace("[model]", "[model]\nmodle = 'x'"),
            "  - model.modle: Unrecognized key",
        ),
        (
            lambda t: t.replace("n = 3", 'n = "three"'),
            "  - evaluation.n: must be an integer, got 'three'",
        ),
        (
            lambda t: t.replace('CALC_MODE = "strict"', "CALC_MODE = 3"),
            "  - env.CALC_MODE: must be a string, got 3",
        ),
        (lambda t: t.replace("[experiment]", "[experimnt]"), "Missing [experiment] section in"),
        (
            lambda t: t.replace('dataset = "rows.jsonl"', ""),
            "Missing 'dataset' in [experiment] section of",
        ),
        (lambda t: t.replace("required =", "needed ="), "[secrets] in"),
        (lambda t: t.replace("CALC_MODE", "_OSMOSIS_MODE"), "are reserved by the platform"),
        (
            lambda t: t.replace('commit_sha = "0123abc"', 'commit_sha = "main"'),
            "experiment.commit_sha: is invalid",
        ),
        (lambda t: t.replace("n = 3", "n = 3\nn = 4"), "Invalid TOML in"),
        (
            lambda t: t.replace('rollout = "multiply"', 'rollout = "../etc"'),
            "must be a path inside the workspace",
        ),
    ],
)
def test_a_wrong_file_is_refused_with_upstreams_words(
    workspace: Path, change: object, says: str
) -> None:
    assert callable(change)
    with pytest.raises(EvalConfigError) as refused:
        load_eval_config(config_file(workspace, change(GOOD)))
    assert says in str(refused.value)


def refused_by_the_cli(path: Path) -> str:
    """What ``rollout-sdk eval run`` says of a config it refuses (exit 1, no traceback)."""
    run = subprocess.run(
        [sys.executable, "-m", "rollout_sdk.cli", "eval", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=path.parent,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "Traceback" not in output
    return output


def test_the_cli_prints_the_error_and_exits_1_without_a_traceback(workspace: Path) -> None:
    output = refused_by_the_cli(config_file(workspace, GOOD + "\n[bogus]\n"))
    assert "bogus: Unrecognized section" in output


def test_secrets_the_environment_lacks_stop_the_run(workspace: Path) -> None:
    assert "EVAL_TEST_SECRET" in refused_by_the_cli(config_file(workspace, GOOD))
