"""The ``sandboxes`` benchmark point runs and reports what PERFORMANCE.md quotes: a line per
system (the fleet on one and on two workers, upstream osmosis-ai 0.3.8's own HarborBackend on
its own server) with trials per second and the trials' phase timings, then the ratios. Two
trials per system: this checks the machinery, not the figures."""

from __future__ import annotations

import docker

from bench.sandboxes import PHASES
from bench.upstream import NAME as UPSTREAM
from bench.upstream import python_312
from tests.harness import run_point


def test_the_sandboxes_point_reports_fleet_and_upstream_trials_with_their_phases(
    engine: docker.DockerClient,
) -> None:
    done, lines = run_point("sandboxes", "0.05", timeout=900)
    fleet_1w, fleet_2w, upstream, *ratios = lines
    assert [line["system"] for line in (fleet_1w, fleet_2w, upstream)] == [
        "fleet-1w",
        "fleet-2w",
        UPSTREAM,
    ]
    if python_312() is None:  # upstream needs one; the line says why it did not run
        assert upstream["blocker"]
        runs = [fleet_1w, fleet_2w]
    else:
        assert "blocker" not in upstream, upstream["blocker"]
        runs = [fleet_1w, fleet_2w, upstream]
    for line in runs:
        assert line["completed"] == line["offered"] == 2, line
        assert line["errors"] == {}
        assert line["rewards"] == [1.0]  # tests/test.sh graded the oracle's answer
        assert line["trials_per_s"] > 0
        assert line["trials_timed"] == 2, line["timings_from"]
        for phase in PHASES:
            assert line[f"{phase}_p50"] >= 0
        assert line["trial_sec_p50"] > line["agent_sec_p50"]
        assert line["overhead_sec_p50"] > 0
        assert line["load_avg_1_5_15"]["before"]
    assert (fleet_1w["slots"], fleet_2w["slots"]) == (4, 8)
    # The fleet's v2 result carries the phases; upstream's carries none of them.
    assert set(PHASES) <= set(fleet_1w["result_metrics"])
    if len(runs) == 3:
        assert not set(PHASES) & set(upstream["result_metrics"])
    figures = [line["figure"] for line in ratios]
    assert figures[0] == "fleet-2w / fleet-1w trials/s"
    assert figures[1:] == (
        ["fleet-1w / upstream trials/s", "fleet-2w / upstream trials/s"] if len(runs) == 3 else []
    )
    assert "Rollout Fleet benchmark" in done.stdout
