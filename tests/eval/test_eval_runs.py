"""``eval run`` for real: agents answered by the mock TrainGate (a real HTTP server)
whose answers are right, scored against datasets whose ground truths are right on known rows,
so every figure of ``metrics.json`` is known beforehand. In this process
(``rollout-sdk eval run``) and on a fleet started for the run (``rollout-fleet eval run``:
redis-server, gateway, Celery workers).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from rollout_fleet.processes import wait_until
from rollout_sdk.evaluation.results import RESULTS_FILE
from tests.eval.harness import (
    CALCULATOR,
    NO_UP_HERE,
    calculator_rows,
    eval_command,
    metrics_of,
    model_url,
    results_of,
    run_eval,
    stop_half_way,
)
from tests.harness import (
    REPO,
    MockTrainGateClient,
    agent_failing_in_the_gateway,
    screenshot_dir,
    start_mock_trainer,
)
from tests.operations.harness import assert_all_gone, listening_ports

FNS = "tests.eval.scoring_fns"


@pytest.fixture(scope="module")
def keyword_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockTrainGateClient]:
    """A second model, for the baseline: it never answers arithmetic."""
    process, client = start_mock_trainer("keyword", tmp_path_factory.mktemp("baseline"))
    yield client
    process.stop()


@pytest.fixture(scope="module")
def local_run(
    mock_trainer: MockTrainGateClient,
    keyword_mock: MockTrainGateClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """Five rows (two with a wrong ground truth), three samples each, scored by two eval
    functions (one per signature style), beside a baseline model that never gets it right."""
    work = tmp_path_factory.mktemp("local-eval")
    rows = calculator_rows(work / "rows.jsonl", 5)
    run_eval(
        "sdk",
        *("-m", CALCULATOR, "-d", str(rows), "--n", "3", "--max-in-flight", "4"),
        *("--model", "policy-model", "--base-url", model_url(mock_trainer)),
        *("--eval-fn", f"{FNS}:even_samples", "--eval-fn", f"{FNS}:exact"),
        *("--baseline-model", "base", "--baseline-base-url", f"{keyword_mock.url}/v1/rollouts/b"),
        *("-o", str(work / "runs"), "--name", "local", "-q"),
    )
    return work / "runs" / "local"


def test_v1_eval_functions_both_styles_and_a_baseline_give_the_figures_worked_out_by_hand(
    local_run: Path,
) -> None:
    """Three right rows of five; ``even_samples`` passes samples 0 and 2 of a right row (the
    reward: it is the first function), ``exact`` every sample of a right row."""
    metrics = metrics_of(local_run)
    policy, baseline = metrics["models"]["policy"], metrics["models"]["baseline"]
    assert metrics["complete"] is True
    assert (policy["items"], policy["finished"], policy["failed"]) == (15, 15, 0)
    assert policy["mean_reward"] == pytest.approx(6 / 15)
    assert policy["pass_rate"] == pytest.approx(6 / 15)
    assert policy["pass_at_1"] == pytest.approx(3 * (2 / 3) / 5, abs=1e-6)
    assert policy["pass_at_k"] == {"1": pytest.approx(0.4), "2": 0.6, "3": 0.6}
    assert policy["pass_at_n"] == pytest.approx(3 / 5)
    assert policy["eval_fns"][f"{FNS}:exact"] == {"mean": 0.6, "pass_rate": 0.6}
    assert policy["tokens"]["total"] > 0
    assert (baseline["finished"], baseline["mean_reward"], baseline["pass_at_n"]) == (15, 0.0, 0.0)
    assert len(results_of(local_run)) == 30


def test_the_report_shows_the_histogram_and_the_tables_in_chromium(
    local_run: Path, chromium: dict[str, Any]
) -> None:
    """Opened as a person would, the page draws the reward histogram (its bars' colour is on
    the screenshot) and the tables, for both models."""
    from playwright.sync_api import sync_playwright

    output = screenshot_dir("eval-report")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto((local_run / "report.html").as_uri())
            histogram = page.locator("#reward-histogram").first
            assert histogram.is_visible()
            assert page.locator("#reward-histogram rect.bar").count() == 20  # 10 bins × 2 models
            assert page.locator("table.summary").count() == 2
            assert "pass@1" in page.locator("table.summary").first.inner_text()
            assert page.locator("#slowest-policy tr").count() == 11  # header + 10 slowest
            shot = histogram.screenshot(path=str(output / "histogram.png"))
            page.screenshot(path=str(output / "report.png"), full_page=True)
            bar_pixels = page.evaluate(COUNT_BAR_PIXELS, list(shot))
        finally:
            browser.close()
    assert bar_pixels > 500, "the histogram's bars are not on the screenshot"


# Counts the pixels of the bars' colour (#4a78c2) in a PNG, decoded by the browser itself.
COUNT_BAR_PIXELS = """async (bytes) => {
  const blob = new Blob([new Uint8Array(bytes)], {type: 'image/png'});
  const image = await createImageBitmap(blob);
  const canvas = new OffscreenCanvas(image.width, image.height);
  const context = canvas.getContext('2d');
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  let count = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (Math.abs(data[i] - 0x4a) < 8 && Math.abs(data[i + 1] - 0x78) < 8
        && Math.abs(data[i + 2] - 0xc2) < 8) count++;
  }
  return count;
}"""


# --- on a fleet ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return calculator_rows(tmp_path_factory.mktemp("fleet-rows") / "rows.jsonl", 100)


def fleet_args(mock: MockTrainGateClient, rows: Path, runs: Path, name: str) -> list[str]:
    return [
        *("-m", CALCULATOR, "-d", str(rows), "--n", "10"),
        *("--model", "policy-model", "--base-url", model_url(mock)),
        *("-o", str(runs), "--name", name, "-q"),
    ]


@pytest.fixture(scope="module")
def uninterrupted(
    mock_trainer: MockTrainGateClient, fleet_rows: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    runs = tmp_path_factory.mktemp("fleet-runs")
    run_eval("fleet", *fleet_args(mock_trainer, fleet_rows, runs, "whole"))
    return runs / "whole"


def test_a_thousand_work_items_through_a_two_worker_fleet(uninterrupted: Path) -> None:
    """100 rows × 10 samples on the default fleet (two workers): 60 right rows of 100."""
    results = results_of(uninterrupted)
    assert len(results) == 1000
    assert len({(r["row"], r["sample"]) for r in results}) == 1000
    assert len({r["rollout_id"] for r in results}) == 1000
    policy = metrics_of(uninterrupted)["models"]["policy"]
    assert (policy["finished"], policy["succeeded"], policy["failed"]) == (1000, 1000, 0)
    assert policy["mean_reward"] == pytest.approx(0.6)
    assert (policy["pass_at_1"], policy["pass_at_n"]) == (pytest.approx(0.6), pytest.approx(0.6))


def without_timings(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        **metrics,
        "models": {name: {**m, "latency_ms": None} for name, m in metrics["models"].items()},
    }


def test_a_run_stopped_half_way_resumes_only_the_rest_with_the_same_figures(
    mock_trainer: MockTrainGateClient,
    fleet_rows: Path,
    uninterrupted: Path,
    tmp_path: Path,
) -> None:
    """Ctrl-C half way keeps what finished; the same command with the same --name runs only
    the items without a result, and ends with the uninterrupted run's figures."""
    runs = tmp_path / "runs"
    args = fleet_args(mock_trainer, fleet_rows, runs, "halves")
    env = {**os.environ, **NO_UP_HERE}
    output, _, code = stop_half_way("fleet", args, runs / "halves", env, signal.SIGINT, after=300)
    assert code == 130, output
    assert "; resume with: rollout-fleet eval run " in output
    kept = sum(r["status"] == "success" for r in results_of(runs / "halves"))
    assert 300 <= kept < 1000
    assert metrics_of(runs / "halves")["complete"] is False
    second = run_eval("fleet", *fleet_args(mock_trainer, fleet_rows, runs, "halves"))
    assert f"1000 work items, {1000 - kept} to run" in second.stdout
    finished = [r for r in results_of(runs / "halves") if r["status"] != "unfinished"]
    assert len(finished) == 1000  # nothing ran twice (the items cut off ran once, later)
    assert without_timings(metrics_of(runs / "halves")) == without_timings(
        metrics_of(uninterrupted)
    )


def test_a_strands_workflow_from_upstreams_eval_toml(
    mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    """Upstream's workspace layout and TOML, with our [model] and [fleet]: one of four rows
    has a wrong label, two samples each."""
    agent = tmp_path / "rollouts" / "multiply"
    agent.mkdir(parents=True)
    shutil.copy(REPO / "examples" / "strands_multiply" / "main.py", agent / "main.py")
    rows = (REPO / "examples" / "strands_multiply" / "test_data.jsonl").read_text().splitlines()
    wrong = json.loads(rows[2])
    wrong["ground_truth"] = "0"
    (tmp_path / "rows.jsonl").write_text("\n".join([*rows[:2], json.dumps(wrong), rows[3]]) + "\n")
    config = tmp_path / "configs" / "eval" / "multiply.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        "[experiment]\n"
        'rollout = "multiply"\nentrypoint = "main.py"\n'
        'model_path = "openai/policy-model"\ndataset = "rows.jsonl"\n'
        "[evaluation]\nn = 2\nlimit = 4\npass_threshold = 1.0\nagent_workflow_timeout_s = 60\n"
        f'[model]\nbase_url = "{model_url(mock_trainer)}"\n'
        "[fleet]\nworkers = 1\n"
    )
    run_eval("fleet", str(config), "-o", str(tmp_path / "runs"), "--name", "strands", "-q")
    policy = metrics_of(tmp_path / "runs" / "strands")["models"]["policy"]
    assert (policy["finished"], policy["failed"]) == (8, 0)
    assert policy["mean_reward"] == pytest.approx(0.75)
    assert (policy["pass_at_1"], policy["pass_at_n"]) == (pytest.approx(0.75), pytest.approx(0.75))
    assert policy["tokens"]["total"] > 0
    calls = mock_trainer.calls("chat", "eval-model")
    assert calls
    assert {call["body"]["model"] for call in calls} >= {"policy-model"}


def test_retry_failed_reruns_only_the_failures_fresh_reruns_all_and_a_changed_plan_is_refused(
    tmp_path: Path,
) -> None:
    """A first run against an endpoint that answers 500 fails every item (exit 1);
    ``--retry-failed`` once it answers runs those again (the latest result counts), a plain
    rerun runs nothing, ``--fresh`` everything, and the same name with another plan is
    refused."""
    process, mock = start_mock_trainer("calculator", tmp_path / "mock")
    try:
        rows = calculator_rows(tmp_path / "rows.jsonl", 2)
        common = ["-m", CALCULATOR, "-d", str(rows), "--model", "m", "-o", str(tmp_path), "-q"]
        up = ["--base-url", model_url(mock)]
        mock.add_faults({"target": "chat", "status": 500, "times": None})
        down = subprocess.run(
            eval_command("sdk", *common, "--name", "again", *up),
            capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
        )  # fmt: skip
        assert down.returncode == 1, down.stdout + down.stderr
        assert "2 work items, 2 to run" in down.stdout
        assert metrics_of(tmp_path / "again")["models"]["policy"]["failed"] == 2
        mock.http.post(f"{mock.url}/mock/reset").raise_for_status()
        retried = run_eval("sdk", *common, "--name", "again", *up, "--retry-failed")
        assert "2 to run" in retried.stdout
        policy = metrics_of(tmp_path / "again")["models"]["policy"]
        assert (policy["finished"], policy["failed"], policy["mean_reward"]) == (2, 0, 0.5)
        assert "0 to run" in run_eval("sdk", *common, "--name", "again", *up).stdout
        assert "2 to run" in run_eval("sdk", *common, "--name", "again", *up, "--fresh").stdout
        assert len(results_of(tmp_path / "again")) == 2
    finally:
        process.stop()
    refused = subprocess.run(
        eval_command("sdk", *common, "--name", "again", *up, "--n", "2"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert refused.returncode == 1
    assert "was made with another plan" in refused.stdout + refused.stderr


def test_a_sigkilled_run_leaves_no_process_of_the_fleet_it_started(
    mock_trainer: MockTrainGateClient, fleet_rows: Path, tmp_path: Path
) -> None:
    """The fleet an evaluation starts lives in a reaper's process group, as ``up``'s does:
    killed with ``kill -9`` half way, the run leaves no Redis, gateway or worker behind (the
    results it kept stay resumable)."""
    runs = tmp_path / "runs"
    results = runs / "killed" / RESULTS_FILE
    run = subprocess.Popen(
        eval_command("fleet", *fleet_args(mock_trainer, fleet_rows, runs, "killed")),
        cwd=REPO,
        env={**os.environ, **NO_UP_HERE},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: results.is_file() and results.read_text().count("\n") >= 20, 300, "20")
        tree = psutil.Process(run.pid).children(recursive=True)
        ports = listening_ports(tree)
        assert len(tree) >= 4, [p.cmdline() for p in tree]  # Redis, gateway, 2 workers, reaper
        run.kill()
        run.wait()
        assert_all_gone(tree, ports)
    finally:
        if run.poll() is None:
            run.kill()
    assert len(results_of(runs / "killed")) >= 20


def test_a_fleet_that_does_not_start_ends_the_run_at_once_in_one_line(
    mock_trainer: MockTrainGateClient, fleet_rows: Path, tmp_path: Path
) -> None:
    """The gateway of the fleet started for the run cannot load the agent: the run ends as
    soon as it exits, naming its last line and log (it waited 60 s, then a traceback)."""
    agent = agent_failing_in_the_gateway(tmp_path)
    args = fleet_args(mock_trainer, fleet_rows, tmp_path / "runs", "no-fleet")
    args[1] = f"{agent}:agent_loop"
    started = time.monotonic()
    run = subprocess.run(
        eval_command("fleet", *args),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "Traceback" not in output
    said = [line for line in output.splitlines() if "the fleet did not start" in line]
    assert len(said) == 1, output
    assert said[0].startswith("Error: the fleet did not start: gateway exited with code 1: "), said
    assert "RuntimeError: this agent does not load in the gateway (its log: " in said[0]
    assert time.monotonic() - started < 55
