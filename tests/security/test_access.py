"""Who may call the gateway and what a request may make the fleet do: the server key on
every route (both header forms v1 allows, exactly ``Bearer <key>`` for v2, compared in
constant time), the trainer-URL allow-list that closes SSRF through admission, and the
request size limit. Every refusal leaves no record behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import FleetUnderTest, new_id
from tests.security.conftest import MAX_REQUEST_BYTES, SERVER_KEY, admit

V1_PUBLIC = {"/health"}  # P§1.4: never authenticated


def routes(handle: FleetUnderTest) -> Iterator[tuple[str, str]]:
    schema = handle.http.get("/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method in operations:
            yield method.upper(), path.replace("{rollout_id}", "some-id")


def call(handle: FleetUnderTest, method: str, path: str, header: str | None) -> httpx.Response:
    headers = {"Authorization": header} if header is not None else {}
    body: dict[str, Any] | None = None
    if path == "/v1/rollout/init":
        body = handle.body()  # v1 validates the body before the key (P§1.2)
    elif path == "/rollout":
        body = handle.body()
    elif path == "/rollout/cancel":
        body = {"rollout_ids": ["some-id"]}
    client = httpx.Client(base_url=handle.fleet.gateway_url, timeout=30)
    with client:
        return client.request(method, path, json=body, headers=headers)


def refused_headers(protocol: str) -> list[str | None]:
    wrong = [None, "", "Bearer wrong", f"Bearer {SERVER_KEY.lower()}", f"Basic {SERVER_KEY}"]
    if protocol == "v2":  # exactly "Bearer <key>" (P§2.2)
        wrong += [SERVER_KEY, f"bearer {SERVER_KEY}", f"Bearer  {SERVER_KEY}"]
    return wrong


def accepted_headers(protocol: str) -> list[str]:
    if protocol == "v1":  # any-case Bearer, or the raw token (P§1.2)
        return [f"Bearer {SERVER_KEY}", f"bearer {SERVER_KEY}", SERVER_KEY]
    return [f"Bearer {SERVER_KEY}"]


def test_every_route_needs_the_key_in_an_allowed_form(locked: FleetUnderTest) -> None:
    checked = []
    for method, path in [*routes(locked), ("GET", "/docs"), ("GET", "/no-such-route")]:
        public = locked.protocol == "v1" and (
            path in V1_PUBLIC
            or (method == "GET" and (path in ("/docs", "/openapi.json", "/no-such-route")))
        )
        if public:
            continue
        for header in refused_headers(locked.protocol):
            response = call(locked, method, path, header)
            assert response.status_code == 401, (method, path, header, response.text)
        for header in accepted_headers(locked.protocol):
            response = call(locked, method, path, header)
            assert response.status_code != 401, (method, path, header, response.text)
        checked.append(path)
    expected = {"/v1/rollout/init", "/platform/health", "/ready"}
    if locked.protocol == "v2":
        expected = {"/rollout", "/rollout/cancel", "/rollout/some-id/result", "/health", "/ready"}
    assert expected <= set(checked)


OUTSIDE = [
    "http://127.0.0.1:1/",  # the right host, another port
    "http://trainer.example:9000/gateway",  # not under /gate
    "http://trainer.example:9000/gate/../admin",
    # read as "/admin" by servers that take ";" as a path parameter or decode twice
    "http://trainer.example:9000/gate/..;/admin",
    "http://trainer.example:9000/gate/%252e%252e/admin",
    "http://trainer.example:9000/gate/%2e%2e/admin",
    "http://trainer.example:9000/gate/..%5cadmin",
    "https://trainer.example:9000/gate",
]
# Refused whatever the list says, with their own reason.
ALWAYS_REFUSED = {
    "http://169.254.169.254/latest/meta-data": "link-local address 169.254.169.254",
    "http://trainer.example:9000/gate?x=": "query or fragment",
    # userinfo that looks like the allowed host: credentials are refused before the list
    "http://trainer.example:9000@evil.example/gate": "must not carry credentials",
}


@pytest.mark.parametrize("url", [*OUTSIDE, *ALWAYS_REFUSED])
def test_a_trainer_url_outside_the_allow_list_is_refused(locked: FleetUnderTest, url: str) -> None:
    rollout_id = new_id("ssrf")
    if locked.protocol == "v1":
        body = locked.body(rollout_id, server_url=url)
        field = "server_url"
    else:
        body = locked.body(rollout_id, chat_completions_url=url)
        field = "chat_completions_url"
    response = admit(locked, body)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", field]
    assert ALWAYS_REFUSED.get(url, "ROLLOUT_FLEET_ALLOWED_TRAINER_URLS") in error["msg"]
    assert locked.redis.exists(locked.record_key(rollout_id)) == 0


def test_v1_tool_server_url_is_held_to_the_allow_list(locked_v1: FleetUnderTest) -> None:
    body = locked_v1.body(tool_server_url="http://10.0.0.1:8080/tools")
    response = admit(locked_v1, body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "tool_server_url"]


def test_a_trainer_url_on_the_allow_list_runs(locked: FleetUnderTest) -> None:
    body = locked.body()
    assert admit(locked, body).status_code == 202
    locked.wait_status(body["rollout_id"], {"success"})


def test_a_body_over_the_size_limit_is_413_before_parsing(locked: FleetUnderTest) -> None:
    body = locked.body(new_id("big"), metadata={"padding": "x" * MAX_REQUEST_BYTES})
    response = admit(locked, body)
    assert response.status_code == 413
    assert "ROLLOUT_FLEET_MAX_REQUEST_BYTES" in response.json()["detail"]
    assert locked.redis.exists(locked.record_key(body["rollout_id"])) == 0


def test_a_chunked_body_over_the_size_limit_is_413(locked: FleetUnderTest) -> None:
    """No Content-Length to refuse it by: the limit applies to the bytes as they arrive."""
    chunk = b"[" + b"1," * (64 * 1024)

    def chunks() -> Iterator[bytes]:
        for _ in range(8):
            yield chunk

    path = "/v1/rollout/init" if locked.protocol == "v1" else "/rollout"
    response = locked.http.post(
        path, content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
