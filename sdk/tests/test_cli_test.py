"""``rollout-sdk test``: an agent runs dataset rows in this process against an OpenAI-compatible
endpoint (here the mock TrainGate over real HTTP), with a summary, JSONL or JSON report
output, per-rollout traces, a stop on an endpoint that refuses for good, clear dataset
errors, and an interactive step-through driven from a real terminal (pexpect)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest

from rollout_sdk.testing import Fault

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = REPO / "examples" / "calculator"
STRANDS = REPO / "examples" / "strands_multiply"
ROWS = 5  # examples/calculator/test_data.jsonl


def run_cli(*args: str, cwd: Path = CALCULATOR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_sdk.cli", "test", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "120"},
    )


def endpoint(mock_url: str, name: str = "cli") -> str:
    """The mock's OpenAI-compatible route, as a ``--base-url``."""
    return f"{mock_url}/v1/rollouts/{name}"


def test_the_calculator_dataset_runs_against_the_mock_and_prints_the_summary(
    mock_trainer: tuple[str, Any], tmp_path: Path
) -> None:
    url, gate = mock_trainer
    out = tmp_path / "results.jsonl"
    done = run_cli(
        "-m", "server:agent_loop", "-d", "test_data.jsonl", "--base-url", endpoint(url),
        "--model", "policy-7b", "-o", str(out), "-c", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Summary" in done.stdout
    assert "reward mean" in done.stdout
    assert "1.0000" in done.stdout
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rollout_id"] for r in results] == [f"test-{i}" for i in range(ROWS)]
    for result in results:
        assert result["success"] is True
        assert result["status"] == "COMPLETED"
        assert result["reward"] == 1.0
        assert result["llm_calls"] >= 2  # tool calls, then the answer
        assert result["token_usage"]["total_tokens"] > 0
        assert result["messages"][-1]["content"].startswith("####")
    calls = [call for call in gate.calls if call.target == "chat"]
    assert len(calls) == sum(result["llm_calls"] for result in results)
    for call in calls:  # OpenAI's dialect, with the chosen model and the agent's tools
        assert call.body["model"] == "policy-7b"
        assert {tool["function"]["name"] for tool in call.body["tools"]} == {"add", "multiply"}
        assert "rollout_id" not in call.body


def test_a_v2_workflow_streams_through_the_bridge(
    mock_trainer: tuple[str, Any], tmp_path: Path
) -> None:
    url, gate = mock_trainer
    report = tmp_path / "report.json"
    done = run_cli(
        "-m", "main.py", "-d", "test_data.jsonl", "--base-url", endpoint(url), "--model", "m",
        "--limit", "4", "-o", str(report), cwd=STRANDS,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(report.read_text())
    assert body["summary"]["total"] == body["summary"]["passed"] == 4
    assert body["summary"]["total_tokens"] > 0
    assert [r["row_index"] for r in body["results"]] == [0, 1, 2, 3]
    assert all(r["reward"] == 1.0 for r in body["results"])
    assert set(body["results"][0]) == {
        "row_index", "success", "error", "duration_ms", "token_usage", "reward", "finish_reason",
    }  # fmt: skip
    assert all(call.body.get("stream") is True for call in gate.calls)


def test_log_writes_each_rollouts_trace(mock_trainer: tuple[str, Any], tmp_path: Path) -> None:
    url, _ = mock_trainer
    logs = tmp_path / "traces"
    done = run_cli(
        "-m", "server:agent_loop", "-d", "test_data.jsonl", "--base-url", endpoint(url),
        "--limit", "2", "--log", str(logs),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in logs.iterdir()) == ["test-0.jsonl", "test-1.jsonl"]
    events = [
        json.loads(line)["event"] for line in (logs / "test-0.jsonl").read_text().splitlines()
    ]
    # the agent's own ctx.log_event lines, then the bridge's view of each call, then the row
    assert events.count("pre_llm") == 2
    assert events.count("llm_request") == events.count("llm_response") == 2
    assert events[-1] == "row_result"


def test_an_endpoint_that_refuses_for_good_stops_the_batch(
    mock_trainer: tuple[str, Any],
) -> None:
    url, _ = mock_trainer
    faults = [Fault(target="chat", status=401, times=None).model_dump()]
    httpx.post(f"{url}/mock/faults", json=faults).raise_for_status()
    done = run_cli(
        "-m", "server:agent_loop", "-d", "test_data.jsonl", "--base-url", endpoint(url),
    )  # fmt: skip
    assert done.returncode == 1
    assert "stopped early" in done.stdout
    assert "authentication failed" in done.stdout
    assert "llm_error" in done.stdout  # the first row's failure, by category


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        ('{"system_prompt": "s", "user_prompt": "u"}\n', "rows.jsonl",
         "missing column(s) ground_truth"),
        ('{"system_prompt": "s", "user_prompt": "", "ground_truth": "1"}\n', "rows.jsonl",
         "row 0: 'user_prompt' must be a non-empty string"),
        ("not json\n", "rows.jsonl", "rows.jsonl:1: not JSON"),
        ("a,b\n", "rows.txt", "use one of .jsonl, .parquet, .csv"),
    ],
)  # fmt: skip
def test_dataset_problems_are_named(tmp_path: Path, content: str, name: str, message: str) -> None:
    (tmp_path / name).write_text(content)
    done = run_cli(
        "-m", f"{CALCULATOR}/server.py:agent_loop", "-d", str(tmp_path / name),
        "--base-url", "http://127.0.0.1:9/v1",
    )  # fmt: skip
    assert done.returncode == 1
    assert message in done.stderr


def test_csv_and_parquet_rows_run_like_jsonl(mock_trainer: tuple[str, Any], tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    url, _ = mock_trainer
    rows = [json.loads(line) for line in (CALCULATOR / "test_data.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "rows.parquet")
    with (tmp_path / "rows.csv").open("w", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[:2])
    for dataset in (tmp_path / "rows.parquet", tmp_path / "rows.csv"):
        done = run_cli(
            "-m", "server:agent_loop", "-d", str(dataset), "--base-url", endpoint(url),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "passed" in done.stdout


def test_interactive_steps_through_one_row(mock_trainer: tuple[str, Any]) -> None:
    url, gate = mock_trainer
    child = pexpect.spawn(
        sys.executable,
        ["-m", "rollout_sdk.cli", "test", "-m", "server:agent_loop", "-d", "test_data.jsonl",
         "--base-url", endpoint(url), "-i", "--row", "2"],
        cwd=str(CALCULATOR),
        env={**os.environ, "TERM": "dumb"},
        encoding="utf-8",
        timeout=60,
        dimensions=(50, 200),
    )  # fmt: skip
    try:
        child.expect("row 2")
        child.expect("call 1 of test-2: 2 messages, 2 tools")
        child.expect("step> ")
        assert not gate.calls  # paused before the first call
        child.sendline("t")
        child.expect('"name": "multiply"')
        child.expect("step> ")
        child.sendline("m")
        child.expect("What is 12 \\* 8\\?")
        child.expect("step> ")
        child.sendline("n")
        child.expect("answer")
        child.expect('"name": "multiply"')  # the model asks for the tool
        child.expect("call 2 of test-2")
        child.expect("step> ")
        assert len(gate.calls) == 1
        child.sendline("c")
        child.expect("row 2: COMPLETED, reward 1.0")
        child.expect("row> ")
        child.sendline("q")
        child.expect("passed")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert len(gate.calls) == 2
