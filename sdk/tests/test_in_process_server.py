"""The in-process v1 server (``create_app``): routes, idempotency and delivery over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rollout_sdk import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult, create_app

Serve = Callable[[Any], str]  # the `serve` fixture: ASGI app -> base URL


CALCULATOR_TOOLS = [{"type": "function", "function": {"name": "add", "description": "add"}}]


class Calculator(RolloutAgentLoop):
    name = "calc"

    def __init__(self) -> None:
        self.runs = 0
        self.tools_calls = 0

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        self.tools_calls += 1
        if request.metadata.get("fail_tools"):
            raise ValueError("no tools today")
        return CALCULATOR_TOOLS

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        self.runs += 1
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            reply = await ctx.chat(messages)
            messages.append(reply.message)
            if not reply.has_tool_calls:
                break
            messages.extend(
                {"role": "tool", "content": "5", "tool_call_id": call["id"]}
                for call in reply.tool_calls
            )
        return ctx.complete(messages, reward=1.0)


def body(trainer: str, rollout_id: str = "r-1", **fields: Any) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "server_url": trainer,
        "messages": [{"role": "user", "content": "What is 2 + 3?"}],
        "completion_params": {},
        **fields,
    }


def wait_for(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_rollout_runs_once_and_is_delivered(serve: Serve, mock_trainer: tuple[str, Any]) -> None:
    trainer, gate = mock_trainer
    agent = Calculator()
    server = serve(create_app(agent))
    first = httpx.post(f"{server}/v1/rollout/init", json=body(trainer))
    again = httpx.post(f"{server}/v1/rollout/init", json=body(trainer))
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json()
    assert first.json()["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {},
        "required": [],
    }
    wait_for(lambda: "r-1" in gate.deliveries)
    delivered = gate.deliveries["r-1"]
    assert len(delivered) == 1
    assert delivered[0]["reward"] == 1.0
    assert delivered[0]["final_messages"][-1]["content"] == "#### 5"
    assert agent.runs == 1
    assert agent.tools_calls == 1
    wait_for(lambda: httpx.get(f"{server}/health").json()["completed_rollouts"] == 1)
    assert httpx.get(f"{server}/health").json() == {
        "status": "healthy",
        "agent_loop": "calc",
        "active_rollouts": 0,
        "completed_rollouts": 1,
    }


def test_get_tools_failure_is_500_and_forgotten(
    serve: Serve, mock_trainer: tuple[str, Any]
) -> None:
    trainer, gate = mock_trainer
    agent = Calculator()
    server = serve(create_app(agent))
    failed = httpx.post(
        f"{server}/v1/rollout/init", json=body(trainer, metadata={"fail_tools": True})
    )
    assert failed.status_code == 500
    assert "no tools today" in failed.json()["detail"]
    assert httpx.post(f"{server}/v1/rollout/init", json=body(trainer)).status_code == 202
    wait_for(lambda: "r-1" in gate.deliveries)


@pytest.mark.parametrize("header", [None, "Bearer wrong"])
def test_server_key_is_required_when_configured(
    serve: Serve, mock_trainer: tuple[str, Any], header: str | None
) -> None:
    trainer, _ = mock_trainer
    server = serve(create_app(Calculator(), api_key="k-1"))
    headers = {"Authorization": header} if header else {}
    response = httpx.post(f"{server}/v1/rollout/init", json=body(trainer), headers=headers)
    assert response.status_code == 401
    assert httpx.post(f"{server}/v1/rollout/init", json={}, headers=headers).status_code == 422
    ok = httpx.post(
        f"{server}/v1/rollout/init", json=body(trainer), headers={"Authorization": "k-1"}
    )
    assert ok.status_code == 202
    assert httpx.get(f"{server}/platform/health").status_code == 401
    assert (
        httpx.get(f"{server}/platform/health", headers={"Authorization": "Bearer k-1"}).status_code
        == 200
    )


def test_platform_health_is_404_without_a_key(serve: Serve) -> None:
    server = serve(create_app(Calculator()))
    assert httpx.get(f"{server}/platform/health").status_code == 404


def test_lifespan_hooks_run(serve: Serve) -> None:
    events: list[str] = []

    async def started() -> None:
        events.append("start")

    server = serve(create_app(Calculator(), on_startup=started))
    assert httpx.get(f"{server}/health").status_code == 200
    assert events == ["start"]
