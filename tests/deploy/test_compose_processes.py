"""Issue acceptance (deployment): ``docker-compose.yml`` run as local processes — every
service's command, environment, ports and healthcheck exactly as declared — serves 50
calculator rollouts with two worker replicas; Flower shows them by name and rollout id behind
its login; and no planted secret leaks into logs, Redis (records and broker messages) or Flower.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from rollout_fleet.processes import wait_until
from tests.deploy.conftest import Stack
from tests.harness import MockTrainGateClient, admit_all, calculator_bodies, screenshot_dir

ROLLOUTS = 50


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> Iterator[httpx.Client]:
    with stack.gateway() as client:
        yield client


@pytest.fixture(scope="module")
def calculator_run(
    stack: Stack, gateway: httpx.Client, mock_trainer: MockTrainGateClient
) -> list[dict[str, Any]]:
    """50 calculator rollouts carrying the planted trainer key, run to their callbacks."""
    bodies = calculator_bodies(mock_trainer.url, ROLLOUTS, api_key=stack.planted["TRAINER_API_KEY"])
    admit_all(gateway, bodies)
    ids = {body["rollout_id"] for body in bodies}
    wait_until(lambda: ids <= mock_trainer.deliveries().keys(), 120, "every rollout's callback")
    return bodies


def test_every_service_runs_as_declared_with_two_worker_replicas(
    stack: Stack, gateway: httpx.Client
) -> None:
    running = Counter(container.service for container in stack.compose.containers)
    assert running == {"redis": 1, "gateway": 1, "worker": 2, "flower": 1}
    ready = gateway.get("/ready")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {
        "ready": True,
        "agent": "calculator",
        "protocol": "v1",
        "redis": "ok",
        "workers": 2,
        "capacity": 200,  # 2 replicas x ROLLOUT_FLEET_WORKER_CONCURRENCY from .env.example
        "get_tools": "ok",
    }
    with pytest.raises(redis.AuthenticationError):  # requirepass from the .env
        redis.Redis(port=stack.redis().connection_pool.connection_kwargs["port"]).ping()


def test_50_calculator_rollouts_complete_once_through_the_declared_services(
    stack: Stack, calculator_run: list[dict[str, Any]], mock_trainer: MockTrainGateClient
) -> None:
    deliveries = mock_trainer.deliveries()
    for body in calculator_run:
        (done,) = deliveries[body["rollout_id"]]  # exactly one callback each
        assert done["status"] == "COMPLETED"
        truth = body["metadata"]["ground_truth"]
        assert done["reward"] == (0.0 if truth == "-1" else 1.0)
    store = stack.redis()
    owners = {store.hget(f"rf:v1:{body['rollout_id']}", "worker") for body in calculator_run}
    hosts = Counter(owner.rsplit(":", 1)[0] for owner in owners if owner)
    assert len(hosts) == 2, f"both worker replicas should have run rollouts: {hosts}"


def test_flower_names_each_rollout_and_shows_nothing_else_of_its_request(
    stack: Stack, calculator_run: list[dict[str, Any]]
) -> None:
    tasks = list(stack.flower_tasks().values())
    for body in calculator_run:
        (task,) = [t for t in tasks if body["rollout_id"] in (t.get("args") or "")]
        assert task["name"] == "rollout.run"
        assert task["args"] == repr(body["rollout_id"])  # the id only, never the request
        assert task["kwargs"] in ("{}", None)
        assert task["state"] == "SUCCESS"


@pytest.mark.parametrize("path", ["/", "/tasks", "/workers", "/api/tasks", "/api/workers"])
def test_flower_refuses_anonymous_requests(stack: Stack, path: str) -> None:
    with stack.flower(auth=False) as flower:
        assert flower.get(path).status_code == 401
    with stack.flower() as flower:
        assert flower.get(path).status_code == 200


def test_a_browser_logs_into_flower_and_finds_a_finished_rollout(
    stack: Stack, calculator_run: list[dict[str, Any]], chromium: dict[str, Any]
) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    rollout_id = calculator_run[0]["rollout_id"]
    user, password = stack.flower_login
    output = screenshot_dir("flower")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium)
        try:
            # No credentials: Chromium gives up on the login prompt; wrong ones: a 401.
            intruder = browser.new_page()
            with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
                intruder.goto(f"{stack.flower_url}/tasks")
            wrong = {"username": user, "password": "wrong"}
            response = (
                browser.new_context(http_credentials=wrong)
                .new_page()
                .goto(f"{stack.flower_url}/tasks")
            )
            assert response is not None
            assert response.status == 401

            context = browser.new_context(
                http_credentials={"username": user, "password": password},
                viewport={"width": 1600, "height": 900},
            )
            page = context.new_page()
            response = page.goto(f"{stack.flower_url}/tasks")
            assert response is not None
            assert response.status == 200
            page.get_by_role("searchbox").fill(rollout_id)
            row = page.locator("table#tasks-table tbody tr", has_text=rollout_id)
            try:
                row.wait_for(timeout=30_000)
            except PlaywrightError:
                page.screenshot(path=output / "not-found.png", full_page=True)
                (output / "not-found.html").write_text(page.content())
                raise
            assert row.count() == 1
            assert "rollout.run" in row.inner_text()
            assert "SUCCESS" in row.inner_text()
            screenshot = output / "tasks.png"
            page.screenshot(path=screenshot, full_page=True)
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000


def test_no_planted_secret_reaches_logs_redis_broker_messages_or_flower(
    stack: Stack, calculator_run: list[dict[str, Any]], mock_trainer: MockTrainGateClient
) -> None:
    # The secrets were in use: the trainer key reached the TrainGate, the others guard the
    # services (checked above), so finding none of them below is meaningful.
    calls = mock_trainer.calls("chat", calculator_run[0]["rollout_id"])
    assert calls[0]["headers"]["authorization"] == f"Bearer {stack.planted['TRAINER_API_KEY']}"

    secrets = dict(stack.planted)
    secrets["FLOWER_BASIC_AUTH"] = secrets["FLOWER_BASIC_AUTH"].partition(":")[2]
    assert stack.leaks(secrets) == []
