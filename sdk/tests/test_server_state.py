"""The in-process servers' bookkeeping, under upstream's names: ``AppState`` (v1), the
polling ``LeaseManager`` and the ``RolloutFutureRegistry`` (v2), and the in-process v2 server
built on the lease manager, over real HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowContext,
    LocalBackend,
    RolloutServerSettings,
    create_rollout_server,
)
from rollout_sdk.server import POLLING_LEASE_HEADER, AppState
from rollout_sdk.server.lease import InvalidLeaseError, LeaseManager, UnknownLeaseError
from rollout_sdk.server.result_registry import (
    DuplicateRolloutError,
    RolloutFutureRegistry,
    UnknownRolloutError,
)
from rollout_sdk.types import RolloutErrorCategory, RolloutResultResponse, RolloutStatus

Serve = Callable[[Any], str]
SUCCESS = RolloutResultResponse(rollout_id="r", status=RolloutStatus.SUCCESS)


def running() -> RolloutStatus:
    return RolloutStatus.RUNNING


# --- AppState -----------------------------------------------------------------------------


def test_app_state_limits_come_from_the_server_settings() -> None:
    state = AppState(settings=RolloutServerSettings(max_concurrent_rollouts=7))
    assert (state.max_concurrent, state.record_ttl, state.cleanup_interval) == (7, 3600.0, 60.0)
    assert AppState(max_concurrent=3, record_ttl_seconds=5).max_concurrent == 3


@pytest.mark.anyio
async def test_app_state_admits_a_key_once_and_forgets_it_after_the_ttl() -> None:
    state = AppState(max_concurrent=2, record_ttl_seconds=60)
    future, leader = state.get_or_create_init_future("k")
    again, follower_leads = state.get_or_create_init_future("k")
    assert leader
    assert not follower_leads
    assert again is future
    assert state.is_duplicate("k")
    assert not state.is_duplicate("other")

    task = asyncio.create_task(asyncio.sleep(0))
    state.mark_started("k", task)
    assert (state.active_count, state.completed_count) == (1, 0)
    await task
    state.mark_completed("k")
    assert (state.active_count, state.completed_count) == (0, 1)

    state.prune_completed_records()
    assert state.is_duplicate("k")  # within the TTL
    state.record_ttl = 0
    state.prune_completed_records()
    assert (state.completed_count, state.is_duplicate("k")) == (0, False)


@pytest.mark.anyio
async def test_app_state_cleans_up_in_the_background_and_cancels_what_runs() -> None:
    state = AppState(record_ttl_seconds=0.01, cleanup_interval_seconds=0.05)
    state.start_cleanup_task()
    state.mark_completed("done")
    sleeper = asyncio.create_task(asyncio.sleep(60))
    state.mark_started("running", sleeper)
    await asyncio.sleep(0.3)
    assert state.completed_count == 0
    await state.stop_cleanup_task()
    await state.cancel_all()
    assert sleeper.cancelled()
    assert state.active_count == 0


# --- LeaseManager -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_lease_expires_unless_renewed() -> None:
    expired: list[str] = []

    async def on_expired(rollout_id: str) -> None:
        expired.append(rollout_id)

    leases = LeaseManager(timeout_sec=0.4, on_expired=on_expired)
    leases.register("kept", "k")
    leases.register("dropped", "d")
    with pytest.raises(ValueError, match="already registered"):
        leases.register("kept", "x")
    for _ in range(6):  # 0.9 s of renewals every 0.15 s
        await asyncio.sleep(0.15)
        assert leases.renew("kept", "k")
    assert expired == ["dropped"]
    assert leases.expired("dropped")
    assert not leases.renew("dropped", "d")

    with pytest.raises(InvalidLeaseError):
        leases.authenticate("kept", "wrong")
    with pytest.raises(UnknownLeaseError):
        leases.authenticate("never", "k")
    leases.finish("kept")  # a finished rollout's lease no longer expires, but still admits
    await asyncio.sleep(0.6)
    assert expired == ["dropped"]
    leases.authenticate("kept", "k")
    leases.remove("kept")
    with pytest.raises(UnknownLeaseError):
        leases.authenticate("kept", "k")
    await leases.close()


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("inf"), float("nan")])
def test_a_lease_timeout_must_be_finite_and_positive(timeout: float) -> None:
    async def ignore(rollout_id: str) -> None: ...

    with pytest.raises(ValueError, match="timeout_sec must be finite and greater than zero"):
        LeaseManager(timeout_sec=timeout, on_expired=ignore)


# --- RolloutFutureRegistry ----------------------------------------------------------------


def registry(wait: float, lease: float, retention: float, cancelled: list[str]) -> Any:
    return RolloutFutureRegistry(
        result_wait_timeout_sec=wait,
        polling_lease_timeout_sec=lease,
        result_retention_sec=retention,
        cancel_rollout=cancelled.append,
    )


@pytest.mark.anyio
async def test_the_registry_long_polls_for_the_result_and_keeps_it_for_the_retention() -> None:
    cancelled: list[str] = []
    results = registry(wait=0.2, lease=5, retention=0.3, cancelled=cancelled)
    await results.register("r", "tok")
    with pytest.raises(DuplicateRolloutError):
        await results.register("r", "tok")
    await results.set_status("r", RolloutStatus.RUNNING)
    early = await results.wait_for_result("r", "tok", running)  # the wait times out
    assert (early.rollout_id, early.status) == ("r", RolloutStatus.RUNNING)

    results.result_wait_timeout_sec = 5
    poll = asyncio.create_task(results.wait_for_result("r", "tok", running))
    await asyncio.sleep(0.05)
    assert await results.complete("r", SUCCESS)
    assert (await poll).status is RolloutStatus.SUCCESS
    assert not await results.complete("r", SUCCESS)  # resolved once
    with pytest.raises(InvalidLeaseError):
        await results.wait_for_result("r", "wrong", running)
    await asyncio.sleep(0.5)
    with pytest.raises(UnknownRolloutError):
        await results.wait_for_result("r", "tok", running)
    assert cancelled == []
    await results.close()


@pytest.mark.anyio
async def test_the_registry_expires_an_unpolled_rollout_and_stops_it() -> None:
    cancelled: list[str] = []
    results = registry(wait=0.1, lease=0.3, retention=60, cancelled=cancelled)
    await results.register("r", "tok")
    execution = asyncio.create_task(asyncio.sleep(60))
    await results.bind_task("r", execution)
    await asyncio.sleep(0.6)
    expired = await results.wait_for_result("r", "tok", running)
    assert (expired.status, expired.err_category) == (
        RolloutStatus.FAILURE,
        RolloutErrorCategory.LEASE_EXPIRED,
    )
    assert expired.err_message == "polling lease expired"
    assert cancelled == ["r"]
    assert execution.cancelled()
    assert not await results.complete("r", SUCCESS)  # the late result is discarded
    await results.close()


@pytest.mark.parametrize(
    ("wait", "lease", "retention", "message"),
    [
        (0.0, 1.0, 0.0, "result_wait_timeout_sec must be finite and greater than zero"),
        (1.0, 1.0, 0.0, "polling_lease_timeout_sec must be finite and exceed"),
        (1.0, 2.0, -1.0, "result_retention_sec must be finite and non-negative"),
    ],
)
def test_the_registry_checks_its_timeouts(
    wait: float, lease: float, retention: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        registry(wait, lease, retention, [])


# --- the in-process v2 server's leases ------------------------------------------------------


class Sleepy(AgentWorkflow):
    cancelled: set[str] = set()  # noqa: RUF012 - filled by the server's thread, read by the test

    async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            Sleepy.cancelled.add(str((ctx.metadata or {})["name"]))
            raise


def test_the_in_process_server_expires_unpolled_rollouts_and_keeps_polled_ones(
    serve: Serve,
) -> None:
    app = create_rollout_server(
        backend=LocalBackend(workflow=Sleepy),
        configure_logging=False,
        result_wait_timeout_sec=0.2,
        polling_lease_timeout_sec=1.0,
    )
    url = serve(app)
    tokens = {}
    for name in ("ignored", "polled"):
        admission = httpx.post(
            f"{url}/rollout",
            json={
                "rollout_id": name,
                "initial_messages": [{"role": "user", "content": "hi"}],
                "chat_completions_url": "http://127.0.0.1:9/v1",
                "metadata": {"name": name},
            },
        )
        assert admission.status_code == 202
        tokens[name] = admission.json()["polling_lease_token"]

    def poll(name: str, token: str | None = None) -> httpx.Response:
        headers = {POLLING_LEASE_HEADER: token or tokens[name]}
        return httpx.get(f"{url}/rollout/{name}/result", headers=headers)

    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # only "polled" is polled, for twice the lease
        assert poll("polled").json()["status"] in ("queued", "running")
    expired = poll("ignored").json()
    assert (expired["status"], expired["err_category"]) == ("failure", "lease_expired")
    assert "ignored" in Sleepy.cancelled
    assert "polled" not in Sleepy.cancelled
    assert poll("polled", token="wrong").status_code == 403
    assert poll("never", token="any").status_code == 404
