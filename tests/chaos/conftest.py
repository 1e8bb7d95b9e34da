"""Chaos scenarios each run a fleet of their own (its own Redis, recorded by MONITOR)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import ChaosFleet, Protocol
from tests.harness import SCRIPTED_AGENT, SCRIPTED_V2_AGENT, MockTrainGateClient

AGENTS = {"v1": SCRIPTED_AGENT, "v2": SCRIPTED_V2_AGENT}

StartChaos = Callable[..., ChaosFleet]


@pytest.fixture(params=["v1", "v2"])
def protocol(request: pytest.FixtureRequest) -> Protocol:
    value: Protocol = request.param
    return value


@pytest.fixture
def start_chaos(
    protocol: Protocol, mock_trainer: MockTrainGateClient, tmp_path: Path
) -> Iterator[StartChaos]:
    """Start this test's fleet (the scripted agent of its protocol unless told otherwise);
    stopped, and the mock TrainGate's faults cleared, when the test ends."""
    started: list[ChaosFleet] = []
    mock_trainer.reset()

    def start(agent: str | None = None, **options: Any) -> ChaosFleet:
        chaos = ChaosFleet.start(
            protocol,
            agent or AGENTS[protocol],
            mock_trainer,
            tmp_path / f"fleet{len(started)}",
            **options,
        )
        started.append(chaos)
        return chaos

    yield start
    mock_trainer.reset()
    for chaos in started:
        chaos.stop()
