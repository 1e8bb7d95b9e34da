"""The benchmark runs from its documented command and reports what PERFORMANCE.md quotes:
a line per system (fleet and baseline) with throughput, latency, CPU per role and memory,
and a line per target. A tiny scale: this checks the machinery, not the figures."""

from __future__ import annotations

from tests.harness import run_point


def test_a_tiny_dispatch_point_reports_fleet_baseline_and_target() -> None:
    done, lines = run_point("dispatch", "0.02")
    fleet, lean, baseline, target, lean_target = lines[:5]
    assert [line["system"] for line in (fleet, lean, baseline)] == [
        "fleet-2w",
        "fleet-2w no task events",
        "baseline",
    ]
    for system in (fleet, lean, baseline):
        assert system["completed"] == system["offered"] == 40
        assert system["errors"] == {}
        assert system["rollouts_per_s"] > 0
        assert system["p99_ms"] >= system["p50_ms"] > 0
        assert system["server_cpu_ms_per_rollout"] > 0
    assert set(fleet["cpu_ms_per_rollout"]) == {"gateway", "workers", "redis"}
    assert fleet["peak_rss_mb"]["workers"] > 0
    assert (target["figure"], target["target"]) == ("fleet CPU ms/rollout", "<= 2")
    assert target["met"] == (target["value"] <= 2)
    assert target["gap"] == round(target["value"] - 2, 2)
    assert (lean_target["figure"], lean_target["target"]) == (
        "fleet CPU ms/rollout, no task events",
        "<= 1.5",
    )
    by_figure = {line["figure"]: line for line in lines[5:]}
    commands = by_figure["Redis commands/rollout"]
    assert (commands["value"], commands["target"]) == (fleet["redis_commands_per_rollout"], "<= 30")
    by_name = sum(fleet["redis_commands_by_name"].values())
    assert abs(by_name - fleet["redis_commands_per_rollout"]) < 1, fleet["redis_commands_by_name"]
    assert by_figure["Redis CPU ms/rollout"]["value"] == fleet["cpu_ms_per_rollout"]["redis"]
    assert fleet["redis_commands_by_name"]["evalsha"] > 0  # the store's scripts ran
    assert "Rollout Fleet benchmark" in done.stdout  # the table follows the lines


def test_the_cli_start_point_reports_each_command_beside_the_interpreter() -> None:
    _, lines = run_point("cli-start", "0.1")
    assert [line["figure"] for line in lines] == [
        "python -c pass (baseline) ms",
        "rollout-fleet --help ms",
        "rollout-sdk --help ms",
        "rollout-fleet status <id> ms",
        "rollout-fleet status <id>, no bytecode cache ms",
    ]
    baseline, *commands = lines
    for line in lines:
        assert line["target"] == "report"
        assert line["runs"] == 3
        assert line["value"] > 0
        assert line["cpu_ms"] > 0
    for line in commands:
        assert line["over_baseline_ms"] == line["value"] - baseline["value"]
