"""Fixtures that run real parts: a redis-server, a mock TrainGate process, and fleets of
gateway + Celery worker processes, each fleet in its own Redis database."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from tests.harness import (
    SCRIPTED_AGENT,
    SCRIPTED_V2_AGENT,
    FleetUnderTest,
    MockTrainGateClient,
    V2FleetUnderTest,
    start_mock_trainer,
)
from tests.seed_examples import SHARED, write_examples

# Fast knobs so retries, leases and recovery play out in seconds, not minutes.
TEST_ENV = {
    "OSMOSIS_ROLLOUT_CLIENT_RETRY_BASE_DELAY": "0.2",
    "OSMOSIS_ROLLOUT_CLIENT_RETRY_MAX_DELAY": "1",
    "OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "2",
    "ROLLOUT_FLEET_LEASE_SECONDS": "3",
    "ROLLOUT_FLEET_SWEEP_INTERVAL_SECONDS": "1",
    "ROLLOUT_FLEET_GET_TOOLS_TIMEOUT_SECONDS": "2",
}

_databases = itertools.count(1)
# Every fleet ``start_fleet`` started, in order: a test's own are stopped when it ends.
_started: list[FleetUnderTest] = []

StartFleet = Callable[..., FleetUnderTest]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(databases=1024).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seed_examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The seed documents' code examples, each written to a folder of its own."""
    if not SHARED.is_dir():
        pytest.skip(f"the seed documents are not here ({SHARED})")
    return write_examples(tmp_path_factory.mktemp("seed-examples"))


@pytest.fixture(scope="session")
def mock_trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockTrainGateClient]:
    process, client = start_mock_trainer("calculator", tmp_path_factory.mktemp("mock-trainer"))
    yield client
    process.stop()


@pytest.fixture(scope="session")
def start_fleet(
    redis_server: RedisServer,
    mock_trainer: MockTrainGateClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[StartFleet]:
    """Start a fleet (gateway + workers) on a fresh Redis database. One started by a test's
    body is stopped when that test ends (:func:`pytest_runtest_call`), one started by a
    fixture by that fixture; whatever is left, at session end."""

    def start(
        agent: str = SCRIPTED_AGENT,
        *,
        workers: int = 2,
        concurrency: int = 20,
        env: dict[str, str] | None = None,
        handle: type[FleetUnderTest] = FleetUnderTest,
        **options: Any,
    ) -> FleetUnderTest:
        fleet = LocalFleet(
            agent=agent,
            redis_url=redis_server.url_for(next(_databases)),
            workers=workers,
            concurrency=concurrency,
            env={**TEST_ENV, **(env or {})},
            log_dir=tmp_path_factory.mktemp("fleet"),
            **options,
        )
        under_test = handle(fleet, mock_trainer)
        _started.append(under_test)
        fleet.start()
        return under_test

    yield start
    for handle in _started:
        handle.close()


def _runs_with(nodeid: str) -> str:
    """The group of tests one xdist worker runs in turn: a module's tests share its fleets.
    Every test of tests/docker shares the one Docker engine and compose project, and those of
    ``up`` hold well-known ports at times, so each of those sets runs in one worker too."""
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/docker/"):
        return "tests/docker"
    if module.startswith("tests/operations/test_up_"):
        return "tests/operations/test_up_*"
    return module


class _ByGroup(LoadScopeScheduling):
    """xdist's scope scheduling over ``_runs_with``'s groups (its own ``loadgroup`` marks are
    lost on pytest 9, whose node ids xdist can no longer rename)."""

    def _split_scope(self, nodeid: str) -> str:
        return _runs_with(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling:
    return _ByGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest group, the Docker tests, is handed out first."""
    items.sort(key=lambda item: _runs_with(item.nodeid) != "tests/docker")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """The fleets a test's body started stop when it ends: left idle until the session's end,
    each kept its processes beating and polling, and by the suite's last hour hundreds of them
    took most of the machine from the tests still running. (Fixtures' fleets, started while
    the test is set up, are the fixtures' to stop.)"""
    before = len(_started)
    try:
        yield
    finally:
        for handle in _started[before:]:
            handle.close()


def module_fleet(*args: Any, **options: Any) -> Any:
    """A module-scoped fixture running one fleet with these options for the module's tests."""

    @pytest.fixture(scope="module")
    def fixture(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
        handle = start_fleet(*args, **options)
        yield handle
        handle.close()

    return fixture


fleet = module_fleet()  # the default: the scripted agent, no server key, two workers

# v2 fleets answer status-only polls after 2 s instead of 30 s.
V2_ENV = {"ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "2"}


def v2_fleet(*, env: dict[str, str] | None = None, **options: Any) -> Any:
    """A module fleet for the scripted v2 agent: two gateways (admit on one, poll on the
    other) and two workers unless told otherwise."""
    options = {"gateways": 2, "workers": 2, **options}
    return module_fleet(
        SCRIPTED_V2_AGENT, handle=V2FleetUnderTest, env={**V2_ENV, **(env or {})}, **options
    )


@pytest.fixture(scope="session")
def chromium() -> dict[str, Any]:
    """How to launch headless Chromium: Debian's ``chromium`` (what CI installs), else
    Playwright's own build, downloaded once."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    system = shutil.which("chromium") or shutil.which("chromium-browser")
    if system:
        return {"executable_path": system, "args": flags}
    subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=True)
    return {"args": flags}
