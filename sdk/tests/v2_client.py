"""A trainer's side of the v2 protocol for SDK tests: admit a rollout over real HTTP, then
long-poll it to its final result."""

from __future__ import annotations

import time
from typing import Any

import httpx

from rollout_sdk.server import POLLING_LEASE_HEADER

TERMINAL = ("success", "failure", "cancelled")


def admit(
    url: str,
    rollout_id: str,
    *,
    prompt: str = "hi",
    llm_api_key: str | None = None,
    **metadata: Any,
) -> str:
    """``POST /rollout`` (asserting 202); the polling lease token."""
    response = httpx.post(
        f"{url}/rollout",
        json={
            "rollout_id": rollout_id,
            "initial_messages": [{"role": "user", "content": prompt}],
            "chat_completions_url": "http://127.0.0.1:9/v1",
            "llm_api_key": llm_api_key,
            "metadata": metadata,
        },
    )
    assert response.status_code == 202, response.text
    token: str = response.json()["polling_lease_token"]
    return token


def final(url: str, rollout_id: str, token: str, timeout: float = 60) -> dict[str, Any]:
    """Long-poll until the rollout's status is terminal; the result body."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = httpx.get(
            f"{url}/rollout/{rollout_id}/result",
            headers={POLLING_LEASE_HEADER: token},
            timeout=60,
        ).json()
        if body["status"] in TERMINAL:
            return body
    raise AssertionError(f"{rollout_id} did not finish within {timeout}s")


__all__ = ["TERMINAL", "admit", "final"]
