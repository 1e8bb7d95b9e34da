"""Operating a running fleet — ``GET /v1/rollouts[/{id}]`` and ``rollout-fleet
status / ls / cancel / export`` over the records in Redis, trajectories streamed to a
directory as rollouts finish, and JSON log lines naming their rollout (real gateway,
workers, Redis and mock TrainGate; the v1 calculator)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StartFleet
from tests.harness import CALCULATOR_AGENT, FleetUnderTest, calculator_bodies, exported, fleet_cli

COUNT = 10
EXPORT_FIELDS = {
    "rollout_id", "protocol", "status", "attempt", "worker", "accepted_at", "started_at",
    "claimed_at", "finished_at", "queue_wait_seconds", "run_seconds", "age_seconds",
    "cancel_requested", "delivery", "reward", "error", "error_category", "label", "metadata",
    "messages", "trajectory_messages", "finish_reason", "usage", "turns",
}  # fmt: skip


@pytest.fixture(scope="module")
def sink(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trajectories")


@pytest.fixture(scope="module")
def calculator(start_fleet: StartFleet, sink: Path) -> Iterator[tuple[FleetUnderTest, list[str]]]:
    handle = start_fleet(
        CALCULATOR_AGENT,
        env={
            "ROLLOUT_FLEET_TRAJECTORY_DIR": str(sink),
            "ROLLOUT_FLEET_LOG_FORMAT": "json",
            # the cancel test's stalled call must still be in flight when the cancel arrives
            "OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "60",
        },
    )
    bodies = calculator_bodies(handle.trainer.url, COUNT)
    for body in bodies:
        assert handle.init(body).status_code == 202
    ids = [body["rollout_id"] for body in bodies]
    handle.wait_delivered(ids)
    for rollout_id in ids:
        handle.wait_status(rollout_id, {"success"})
    yield handle, ids
    handle.close()


def test_one_rollout_by_id_over_http_and_the_cli(
    calculator: tuple[FleetUnderTest, list[str]],
) -> None:
    handle, ids = calculator
    wrong_label, right = ids[0], ids[1]  # every 10th row carries a wrong ground truth
    view = handle.http.get(f"/v1/rollouts/{right}").json()
    assert view["status"] == "success"
    assert view["protocol"] == "v1"
    assert view["attempt"] == 1
    assert view["worker"]
    assert view["reward"] == 1.0
    assert view["delivery"] == "delivered"
    assert view["queue_wait_seconds"] >= 0
    assert view["run_seconds"] > 0
    assert view["accepted_at"] <= view["started_at"] <= view["finished_at"]
    assert handle.http.get(f"/v1/rollouts/{wrong_label}").json()["reward"] == 0.0
    missing = handle.http.get("/v1/rollouts/never-admitted")
    assert missing.status_code == 404
    assert "never admitted, or expired" in missing.json()["detail"]

    done = fleet_cli(handle, "status", right, "--json")
    assert done.returncode == 0, done.stderr
    by_cli = json.loads(done.stdout)
    assert by_cli.pop("age_seconds") >= view.pop("age_seconds")  # read a moment later
    assert by_cli == view
    table = fleet_cli(handle, "status", right)
    assert "delivered" in table.stdout
    unknown = fleet_cli(handle, "status", "never-admitted")
    assert unknown.returncode == 1
    assert "never admitted, or expired" in unknown.stdout


def test_a_v1_rollout_admitted_with_an_idempotency_key_is_found_by_either_id(
    calculator: tuple[FleetUnderTest, list[str]],
) -> None:
    """The record is kept under the idempotency key; the rollout id finds it too (HTTP,
    ``status``, ``cancel``), for as long as the record is kept and no longer."""
    handle, _ = calculator
    done, running = calculator_bodies(handle.trainer.url, 2)
    done["idempotency_key"], running["idempotency_key"] = "key-of-done", "key-of-running"
    assert handle.init(done).status_code == 202
    handle.wait_status("key-of-done", {"success"})
    by_id = handle.http.get(f"/v1/rollouts/{done['rollout_id']}")
    by_key = handle.http.get("/v1/rollouts/key-of-done")
    assert by_id.status_code == by_key.status_code == 200
    assert by_id.json()["rollout_id"] == done["rollout_id"]
    assert by_id.json()["status"] == "success"
    shown = fleet_cli(handle, "status", done["rollout_id"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "success"
    alias = handle.keys.v1_alias(done["rollout_id"])
    assert handle.redis.get(alias) == handle.record_key("key-of-done")
    assert (
        abs(handle.redis.pttl(alias) - handle.redis.pttl(handle.record_key("key-of-done"))) < 1000
    )

    handle.trainer.add_faults(
        {"target": "chat", "delay_s": 30, "rollout_id": running["rollout_id"], "times": None}
    )
    assert handle.init(running).status_code == 202
    handle.wait_status("key-of-running", {"running"})
    cancelled = fleet_cli(handle, "cancel", running["rollout_id"])
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"{running['rollout_id']}: cancelled_running" in cancelled.stdout
    handle.wait_status("key-of-running", {"failure"})


def test_listings_filter_by_status_and_age(calculator: tuple[FleetUnderTest, list[str]]) -> None:
    handle, ids = calculator
    listed = handle.http.get("/v1/rollouts", params={"status": "success", "limit": 1000}).json()
    assert set(ids) <= {view["rollout_id"] for view in listed}
    assert handle.http.get("/v1/rollouts", params={"status": "running"}).json() == []
    assert handle.http.get("/v1/rollouts", params={"older_than": 3600}).json() == []
    assert handle.http.get("/v1/rollouts", params={"limit": 0}).status_code == 422
    done = fleet_cli(handle, "ls", "--status", "success", "--newer-than", "3600", "--json")
    assert done.returncode == 0, done.stderr
    assert set(ids) <= {view["rollout_id"] for view in json.loads(done.stdout)}
    table = fleet_cli(handle, "ls", "--limit", "3")
    assert "3 rollouts" in table.stdout


def check_trajectory(line: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    assert set(line) == EXPORT_FIELDS
    assert line["status"] == "success"
    assert line["messages"][-1]["content"].startswith("####")
    assert any(message.get("tool_calls") for message in line["messages"])
    assert line["usage"]["num_llm_calls"] == len(line["turns"]) == len(calls)
    for turn, call in zip(line["turns"], calls, strict=True):
        assert turn["token_ids"] == list(range(len(turn["token_ids"])))  # the mock's fake ids
        assert len(turn["logprobs"]) == len(turn["token_ids"])
        assert turn["usage"]["total_tokens"] > 0
        assert call["body"]["rollout_id"] == line["rollout_id"]


def test_export_writes_one_line_per_finished_rollout(
    calculator: tuple[FleetUnderTest, list[str]], tmp_path: Path
) -> None:
    handle, ids = calculator
    lines, text = exported(handle, tmp_path)
    assert set(ids) <= set(lines)
    for rollout_id in ids:
        check_trajectory(lines[rollout_id], handle.trainer.calls("chat", rollout_id))
    assert lines[ids[0]]["label"] == "-1"
    assert "secret" not in text


def test_the_sink_keeps_each_trajectory_as_it_finishes(
    calculator: tuple[FleetUnderTest, list[str]], sink: Path
) -> None:
    handle, ids = calculator
    files = list(sink.glob("*.jsonl"))
    assert files  # one per worker process that finished rollouts
    lines = [json.loads(line) for path in files for line in path.read_text().splitlines()]
    by_id = {line["rollout_id"]: line for line in lines}
    assert len(by_id) == len(lines)  # each rollout once
    assert set(ids) <= set(by_id)
    for rollout_id in ids:
        check_trajectory(by_id[rollout_id], handle.trainer.calls("chat", rollout_id))


def test_json_log_lines_name_their_rollout(calculator: tuple[FleetUnderTest, list[str]]) -> None:
    handle, ids = calculator
    output = "".join(
        process.output() for name, process in handle.fleet.processes.items() if "worker" in name
    )
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert records, output[-2000:]
    assert all({"time", "level", "logger", "message"} <= set(record) for record in records)
    finished = [r for r in records if r["message"].startswith("finished (")]
    assert {r["rollout_id"] for r in finished} >= set(ids)  # the intake's outcome lines


def test_cancel_stops_a_running_rollout_and_names_unknown_ids(
    calculator: tuple[FleetUnderTest, list[str]],
) -> None:
    handle, _ = calculator
    body = calculator_bodies(handle.trainer.url, 1)[0]
    rollout_id = body["rollout_id"]
    handle.trainer.add_faults(
        {"target": "chat", "delay_s": 30, "rollout_id": rollout_id, "times": None}
    )
    assert handle.init(body).status_code == 202
    handle.wait_status(rollout_id, {"running"})
    done = fleet_cli(handle, "cancel", rollout_id, "never-admitted")
    assert done.returncode == 1  # one id was unknown
    assert f"{rollout_id}: cancelled_running" in done.stdout
    assert "never-admitted: unknown" in done.stdout
    record = handle.wait_status(rollout_id, {"failure"})
    assert record["cancel_requested"] == "1"
    delivered = handle.wait_delivered([rollout_id])[rollout_id]
    assert [d["status"] for d in delivered] == ["ERROR"]
    assert "cancelled" in delivered[0]["error_message"]
    assert len(handle.trainer.calls("chat", rollout_id)) == 1  # stopped mid-call, not retried


def test_operator_routes_sit_behind_the_server_key(start_fleet: StartFleet) -> None:
    handle = start_fleet(CALCULATOR_AGENT, workers=1, env={"ROLLOUT_FLEET_API_KEY": "ops-key"})
    try:
        for path in ("/v1/rollouts", "/v1/rollouts/x", "/metrics"):
            assert handle.http.get(path).status_code == 401
            keyed = handle.http.get(path, headers={"Authorization": "Bearer ops-key"})
            assert keyed.status_code in (200, 404)
    finally:
        handle.close()
