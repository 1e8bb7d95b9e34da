"""``eval run`` when things go wrong, for real: a stop half way (SIGINT on a fleet, SIGTERM in
this process) or while the fleet starts, a model endpoint that is down or fails every call, a
retry on a warm fleet, and what the run prints and draws (an 80-column terminal, the HTML
report in headless Chromium). The mock TrainGate, redis-server, gateway and workers are real
processes.
"""

from __future__ import annotations

import html.parser
import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from rollout_fleet.processes import free_port
from rollout_sdk.evaluation.results import RESULTS_FILE
from tests.eval.harness import (
    CALCULATOR,
    calculator_rows,
    isolated_env,
    metrics_of,
    model_url,
    results_of,
    run_eval,
    stop_half_way,
    stop_when,
)
from tests.harness import REPO, MockTrainGateClient, screenshot_dir, start_mock_trainer
from tests.operations.harness import assert_all_gone, listening_ports, started_up

STOP_SECONDS = 2.0  # from the signal to the exit


def program(cli: str) -> str:
    return "rollout-fleet" if cli == "fleet" else "rollout-sdk"


def statuses(run_dir: Path) -> dict[str, str]:
    """Each item's latest status, as a resumed run reads them."""
    latest = {}
    for line in results_of(run_dir):
        latest[f"{line['model']}:{line['row']}:{line['sample']}"] = line["status"]
    return latest


def assert_quiet(output: str) -> None:
    for noise in ("Traceback", "Task exception", "never retrieved", "Error", "CancelledError"):
        assert noise not in output, output


@pytest.mark.parametrize(
    ("cli", "signum"), [("fleet", signal.SIGINT), ("sdk", signal.SIGTERM)], ids=["fleet", "sdk"]
)
def test_a_run_stopped_half_way_exits_at_once_and_its_resume_counts_only_real_outcomes(
    mock_trainer: MockTrainGateClient, tmp_path: Path, cli: str, signum: signal.Signals
) -> None:
    """Within 2 s of the signal: exit 130, one line naming the signal and the exact command
    that resumes the run, no traceback. The items under way are noted ``unfinished`` (not
    failed: none failed) and no figure counts them; that command runs them again, and the
    finished run has the figures of one never stopped (60 right rows of 100)."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 100)
    runs = tmp_path / "runs"
    args = [
        *("-m", CALCULATOR, "-d", str(rows), "--n", "2", "--model", "policy-model"),
        *("--base-url", model_url(mock_trainer), "-o", str(runs), "--name", "cut", "-q"),
        *(["--max-in-flight", "8"] if cli == "sdk" else []),
    ]
    env = isolated_env(tmp_path / "state")
    output, took, code = stop_half_way(cli, args, runs / "cut", env, signum)
    assert code == 130, output
    resume = shlex.join([program(cli), "eval", "run", *args])
    lines = output.strip().splitlines()
    assert lines[-1].startswith(f"stopped ({signum.name}): "), output
    assert lines[-1].endswith(f"; resume with: {resume}"), output
    assert sum(line.startswith("stopped") for line in lines) == 1
    assert_quiet(output)
    assert took < STOP_SECONDS, f"{took:.2f}s to exit"
    latest = statuses(runs / "cut")
    cut_off = [key for key, status in latest.items() if status == "unfinished"]
    assert cut_off, "no item was under way"
    assert "failure" not in latest.values()
    done = sum(status == "success" for status in latest.values())
    assert lines[-1].startswith(f"stopped ({signum.name}): {done} of 200 items done, ")
    stopped = metrics_of(runs / "cut")["models"]["policy"]
    assert (stopped["finished"], stopped["failed"]) == (done, 0)

    resumed = run_eval(cli, *shlex.split(resume)[3:], env=env, succeeds=False)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"200 work items, {200 - done} to run" in resumed.stdout
    assert set(statuses(runs / "cut").values()) == {"success"}
    policy = metrics_of(runs / "cut")["models"]["policy"]
    assert (policy["finished"], policy["failed"], policy["wrong"]) == (200, 0, 80)
    assert policy["mean_reward"] == pytest.approx(0.6)


def test_a_stop_while_the_fleet_starts_exits_130_with_one_line_and_leaves_nothing(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    """SIGINT once the fleet's processes exist, before it is ready: one line, exit 130 at
    once, and not one process of the fleet is left."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 5)
    args = [
        *("-m", CALCULATOR, "-d", str(rows), "--model", "m", "--base-url", model_url(mock_trainer)),
        *("-o", str(tmp_path / "runs"), "--name", "early", "-q"),
    ]
    tree: list[psutil.Process] = []
    ports: set[int] = set()

    def fleet_spawned(process: subprocess.Popen[str]) -> bool:
        tree[:] = psutil.Process(process.pid).children(recursive=True)
        if not any("worker" in " ".join(p.cmdline()) for p in tree if p.is_running()):
            return False
        ports.update(listening_ports(tree))
        return True

    env = isolated_env(tmp_path / "state")
    output, took, code = stop_when(
        "fleet", args, env, signal.SIGINT, fleet_spawned, "the fleet's processes"
    )
    assert code == 130, output
    assert took < STOP_SECONDS, f"{took:.2f}s to exit"
    assert_quiet(output)
    resume = shlex.join(["rollout-fleet", "eval", "run", *args])
    assert output.strip().splitlines()[1:] == [
        f"stopped (SIGINT) before any item finished; run it with: {resume}"
    ], output
    assert_all_gone(tree, ports)


def test_an_unreachable_model_endpoint_stops_the_run_before_anything_starts(
    tmp_path: Path,
) -> None:
    """Nothing listens at the base URL: exit 1 within seconds, one line naming the URL and
    "connection refused", no fleet started, no result kept."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 5)
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    down = run_eval(
        "fleet",
        *("-m", CALCULATOR, "-d", str(rows), "--model", "m", "--base-url", base_url),
        *("-o", str(tmp_path / "runs"), "--name", "down"),
        env=isolated_env(tmp_path / "state"),
        succeeds=False,
    )
    took = time.monotonic() - started
    assert down.returncode == 1, down.stdout + down.stderr
    assert down.stdout.strip().splitlines()[-1] == (
        f"Error: the model endpoint {base_url} is unreachable: connection refused (policy model)"
    )
    assert "running" not in down.stdout  # no fleet: the run never got that far
    assert_quiet(down.stdout.replace("Error: the model endpoint", "") + down.stderr)
    assert not (tmp_path / "runs" / "down" / RESULTS_FILE).exists()
    assert took < 30, f"{took:.1f}s"  # a fleet start alone takes longer


@pytest.fixture
def failing_mock(tmp_path: Path) -> Iterator[MockTrainGateClient]:
    """A mock TrainGate of the test's own, whose every chat call answers 500."""
    process, client = start_mock_trainer("calculator", tmp_path / "failing-mock")
    client.add_faults({"target": "chat", "status": 500, "times": None})
    yield client
    process.stop()


def test_every_item_failing_exits_1_and_each_failure_names_the_endpoints_answer(
    failing_mock: MockTrainGateClient, tmp_path: Path
) -> None:
    """The endpoint answers every call with a 500: each stored error is that answer at the
    configured URL (not the agent's view of the bridge), the summary groups the failures by
    category with the first error, suggests --retry-failed, and the run exits 1."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 3)
    base_url = model_url(failing_mock)
    args = [
        *("-m", CALCULATOR, "-d", str(rows), "--model", "m", "--base-url", base_url),
        *("-o", str(tmp_path / "runs"), "--name", "bad", "-q"),
    ]
    failed = run_eval("sdk", *args, env=isolated_env(tmp_path / "state"), succeeds=False)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    results = results_of(tmp_path / "runs" / "bad")
    assert {r["status"] for r in results} == {"failure"}
    assert {r["error_category"] for r in results} == {"llm_error"}
    for result in results:
        assert result["error"].startswith(f"{base_url} answered 500: "), result["error"]
    first = results[0]["error"]
    lines = failed.stdout.splitlines()
    assert f"policy: 3 × llm_error: {first}" in lines
    again = shlex.join(["rollout-sdk", "eval", "run", *args, "--retry-failed"])
    assert f"3 failed; run them again with: {again}" in lines
    assert lines[-1] == "Error: every work item failed (the failures are listed above)"
    assert "Traceback" not in failed.stdout + failed.stderr


def test_a_retry_on_a_running_up_starts_no_fleet_and_is_faster_than_a_cold_one(
    tmp_path: Path,
) -> None:
    """Two runs fail both their items (the endpoint answers 500); then, with the endpoint
    right, one retries on a fleet started for it (``--fleet new``: cold) and the other on the
    ``rollout-fleet up`` running here for the same agent (found through its state file:
    warm). Both end right; the warm one says which fleet it used and takes less time."""
    process, mock = start_mock_trainer("calculator", tmp_path / "mock")
    try:
        rows = calculator_rows(tmp_path / "rows.jsonl", 1)
        common = [
            *("-m", CALCULATOR, "-d", str(rows), "--n", "2", "--model", "m"),
            *("--base-url", model_url(mock), "-o", str(tmp_path / "runs"), "-q"),
        ]
        with started_up(
            tmp_path, "--agent", CALCULATOR, "--workers", "1", "--no-flower",
            "--port", str(free_port()),
        ) as up:  # fmt: skip
            env = isolated_env(up.runtime_dir)
            gateway = json.loads(up.state_files()[0].read_text())["gateway_url"]
            mock.add_faults({"target": "chat", "status": 500, "times": None})
            for name, fleet in (("cold", "new"), ("warm", gateway)):
                first = run_eval(
                    "fleet", *common, "--name", name, "--fleet", fleet, env=env, succeeds=False
                )
                assert first.returncode == 1, first.stdout + first.stderr
                assert metrics_of(tmp_path / "runs" / name)["models"]["policy"]["failed"] == 2
            assert f"running on the fleet at {gateway}" in first.stdout
            mock.http.post(f"{mock.url}/mock/reset").raise_for_status()
            timings = {}
            for name, extra in (("cold", ["--fleet", "new"]), ("warm", [])):
                started = time.monotonic()
                retry = run_eval(
                    "fleet",
                    *common,
                    "--name",
                    name,
                    "--retry-failed",
                    *extra,
                    env=env,
                    succeeds=False,
                )
                timings[name] = time.monotonic() - started
                assert retry.returncode == 0, retry.stdout + retry.stderr
                assert "2 work items, 2 to run" in retry.stdout
                policy = metrics_of(tmp_path / "runs" / name)["models"]["policy"]
                assert (policy["finished"], policy["failed"], policy["mean_reward"]) == (2, 0, 1.0)
            assert (
                f"running on the fleet of rollout-fleet up (pid {up.process.pid})" in retry.stdout
            )
    finally:
        process.stop()
    print(f"retry of 2 items: cold {timings['cold']:.1f}s, warm {timings['warm']:.1f}s")
    assert timings["warm"] < timings["cold"], timings


# --- what the run prints and draws --------------------------------------------------------


def test_the_terminal_summary_is_whole_at_80_columns_and_lists_wrong_answers_first(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    """Five rows, two with a wrong ground truth: at 80 columns no header is cut, and the
    rows table starts with the wrong answers (prompt, label and answer on each line)."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 5)
    done = run_eval(
        "sdk",
        *("-m", CALCULATOR, "-d", str(rows), "--model", "m", "--base-url", model_url(mock_trainer)),
        *("-o", str(tmp_path / "runs"), "--name", "narrow", "-q"),
        env=isolated_env(tmp_path / "state", COLUMNS="80"),
        succeeds=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    tables = [line for line in lines if str(tmp_path) not in line]  # a path is not cut
    assert all(len(line) <= 80 for line in tables), max(tables, key=len)
    assert "…" not in "\n".join(line for line in lines if "figure" in line or "verdict" in line)
    header = next(line for line in lines if "verdict" in line)
    assert header.split() == ["row", "verdict", "reward", "ms", "prompt", "label", "answer"]
    for label in ("passed (reward ≥ threshold)", "wrong (completed, below)", "pass@1"):
        assert any(line.strip().startswith(label) for line in lines), label
    body = lines[lines.index(header) + 2 :][:5]
    assert [line.split()[:3] for line in body] == [
        ["1.0", "wrong", "0"],
        ["3.0", "wrong", "0"],
        ["0.0", "passed", "1"],
        ["2.0", "passed", "1"],
        ["4.0", "passed", "1"],
    ]
    for shown in ("What is 100 - 37?", " 64 ", "#### 63"):
        assert shown in body[0]


class _Dom(html.parser.HTMLParser):
    """The rows of the per-row tables and the texts of the pass@k chart's ticks, from the
    DOM Chromium rendered."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.row_classes: dict[str, list[str]] = {}
        self.ticks: dict[str, list[str]] = {"x-tick": [], "y-tick": []}
        self._table: str | None = None
        self._cells: list[str] | None = None
        self._tick: str | None = None
        self._in_chart = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table" and (found.get("id") or "").startswith("rows-"):
            self._table = found["id"]
        elif tag == "tr" and self._table and found.get("class"):
            self.row_classes.setdefault(self._table, []).append(found["class"] or "")
            self._cells = []
        elif tag == "td" and self._cells is not None:
            self._cells.append("")
        elif tag == "svg":
            self._in_chart = found.get("id") == "pass-at-k"
        elif tag == "text" and self._in_chart:
            kind = next((k for k in self.ticks if k in (found.get("class") or "")), None)
            self._tick = kind

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag == "tr" and self._cells is not None and self._table:
            self.rows.setdefault(self._table, []).append(self._cells)
            self._cells = None
        elif tag == "text":
            self._tick = None

    def handle_data(self, data: str) -> None:
        if self._cells:
            self._cells[-1] += data
        if self._tick:
            self.ticks[self._tick].append(data)


def test_the_report_lists_every_row_wrong_answers_first_and_labels_the_pass_at_k_axes(
    mock_trainer: MockTrainGateClient, tmp_path: Path, chromium: dict[str, Any]
) -> None:
    """The HTML report as headless Chromium renders it: per model a row per item (prompt,
    label, answer, reward, verdict, latency), the wrong answers (completed, reward 0) first,
    and the pass@k chart with its k values and 0–100 % on its axes."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 5)
    done = run_eval(
        "sdk",
        *("-m", CALCULATOR, "-d", str(rows), "--n", "3", "--model", "m"),
        *("--base-url", model_url(mock_trainer), "-o", str(tmp_path / "runs"), "--name", "page"),
        "-q",
        env=isolated_env(tmp_path / "state"),
        succeeds=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    page = (tmp_path / "runs" / "page" / "report.html").as_uri()
    browser = [chromium.get("executable_path") or "chromium", *chromium["args"]]
    dom = subprocess.run(
        [*browser, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    output = screenshot_dir("eval-rows")
    subprocess.run(
        [*browser, f"--screenshot={output / 'report.png'}", "--window-size=1400,2400", page],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert (output / "report.png").stat().st_size > 10_000
    parsed = _Dom()
    parsed.feed(dom)
    classes = parsed.row_classes["rows-policy"]
    assert classes == ["wrong"] * 6 + ["passed"] * 9
    cells = parsed.rows["rows-policy"]
    assert len(cells) == 15
    # row, sample, verdict, reward, status, latency, prompt, label, answer, error
    assert cells[0][:5] == ["1", "0", "wrong", "0.000", "success"]
    assert cells[0][6:9] == ["What is 100 - 37?", "64", "#### 63"]
    assert cells[-1][2:4] == ["passed", "1.000"]
    assert parsed.ticks["x-tick"] == ["1", "2", "3"]
    assert parsed.ticks["y-tick"] == ["0%", "25%", "50%", "75%", "100%"]


def test_passed_means_the_reward_reached_the_threshold_in_rollout_sdk_test(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    """Five rows that all complete, two with a wrong ground truth: ``rollout-sdk test`` says
    5 completed and 3 passed, in its table and its JSON report, as ``eval run`` counts them."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 5)
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "rollout_sdk.cli", "test", "-m", CALCULATOR, "-d", str(rows),
         "--base-url", model_url(mock_trainer), "-o", str(report), "-q"],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
        env=isolated_env(tmp_path / "state"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(report.read_text())["summary"]
    assert (summary["total"], summary["completed"], summary["passed"], summary["failed"]) == (
        5,
        5,
        3,
        0,
    )
    figures = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in done.stdout.splitlines()
        if line.count("│") == 3
    }
    assert figures["completed"] == "5"
    assert figures["passed (reward ≥ 1)"] == "3"
    assert figures["failed (did not complete)"] == "0"


def test_text_from_the_dataset_is_shown_as_data_not_obeyed(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    """A prompt holding Rich markup and a terminal escape: the run ends normally, and the
    summary shows both as written (the escape as ``\\x1b``), never rendering or obeying them."""
    rows = calculator_rows(tmp_path / "rows.jsonl", 3)
    hostile = " [/] [link=https://evil.example]x[/link] \x1b]0;PWNED\x07\x1b[31m"
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    for line in lines:
        line["user_prompt"] += hostile
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_eval(
        "sdk",
        *("-m", CALCULATOR, "-d", str(rows), "--model", "m", "--base-url", model_url(mock_trainer)),
        *("-o", str(tmp_path / "runs"), "--name", "hostile", "-q"),
        env=isolated_env(tmp_path / "state", COLUMNS="400"),
        succeeds=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "\x1b]" not in done.stdout
    assert "\x1b[31m" not in done.stdout
    assert "\\x1b]0;PWNED\\x07" in done.stdout
    assert "[/] [link=https://evil.example]x[/link]" in done.stdout
