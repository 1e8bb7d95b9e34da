"""An evaluation's model bridge takes only calls that carry its run's key.

The bridge holds the model endpoint's key and may listen off loopback (for sandboxes): a call
without the run's key, or with another, is refused on each of its routes and never reaches the
endpoint; a call with it is forwarded with the endpoint's own key. A real bridge in front of the
mock TrainGate (a real HTTP server standing for the model endpoint).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from rollout_sdk.localrun.bridge import LLMBridge

RUN_KEY = "run-key-of-this-test"
ENDPOINT_KEY = "sk-endpoint-key"
QUESTION = {"model": "any", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
COMPLETION = {"rollout_id": "r1", "status": "COMPLETED", "final_messages": []}


async def statuses(model_url: str) -> dict[str, int]:
    bridge = LLMBridge(model_url, "policy", ENDPOINT_KEY, key=RUN_KEY)
    await bridge.start()
    try:
        async with httpx.AsyncClient(base_url=bridge.url, timeout=30) as http:
            v2 = "/v1/rollouts/r1/chat/completions"
            wrong = {"Authorization": "Bearer another-key"}
            right = {"Authorization": f"Bearer {RUN_KEY}"}
            answers = {
                "v2 without a key": await http.post(v2, json=QUESTION),
                "v2 with another key": await http.post(v2, json=QUESTION, headers=wrong),
                "v2 as basic auth": await http.post(v2, json=QUESTION, auth=("u", RUN_KEY)),
                "v1 without a key": await http.post(
                    "/v1/chat/completions", json={**QUESTION, "rollout_id": "r1"}
                ),
                "callback with another key": await http.post(
                    "/v1/rollout/completed", json=COMPLETION, headers=wrong
                ),
                "v2 with the key": await http.post(v2, json=QUESTION, headers=right),
                "callback with the key": await http.post(
                    "/v1/rollout/completed", json=COMPLETION, headers=right
                ),
            }
    finally:
        await bridge.stop()
    return {name: answer.status_code for name, answer in answers.items()}


def test_the_bridge_forwards_only_calls_with_its_key_and_sends_the_endpoints_own(
    mock_trainer: tuple[str, Any],
) -> None:
    url, _ = mock_trainer
    seen = asyncio.run(statuses(f"{url}/v1/rollouts/bridge-key-model"))
    assert seen == {
        "v2 without a key": 401,
        "v2 with another key": 401,
        "v2 as basic auth": 401,
        "v1 without a key": 401,
        "callback with another key": 401,
        "v2 with the key": 200,
        "callback with the key": 200,
    }
    answer = httpx.get(
        f"{url}/mock/calls", params={"path": "chat", "rollout_id": "bridge-key-model"}
    )
    calls = answer.raise_for_status().json()
    assert len(calls) == 1  # the refused calls never reached the endpoint
    assert calls[0]["headers"]["authorization"] == f"Bearer {ENDPOINT_KEY}"
    assert calls[0]["body"]["model"] == "policy"


async def cut_mid_body(path: str) -> None:
    """A call whose client goes away half-way through its body, as when a run is stopped."""
    bridge = LLMBridge("http://127.0.0.1:9", "policy", key=RUN_KEY)
    await bridge.start()
    try:
        host, port = bridge.url.removeprefix("http://").rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: bridge\r\nAuthorization: Bearer {RUN_KEY}\r\n"
            'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": '.encode()
        )
        await writer.drain()
        await asyncio.sleep(0.3)  # the route is reading the body now
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.3)
    finally:
        await bridge.stop()


def test_a_call_cut_mid_body_ends_without_a_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """Stopping a run cuts the agent's calls under way: the bridge drops them without logging
    an exception (a stopped run prints one line, no traceback)."""
    for path in ("/v1/chat/completions", "/v1/rollouts/r1/chat/completions"):
        asyncio.run(cut_mid_body(path))
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out, printed.err
