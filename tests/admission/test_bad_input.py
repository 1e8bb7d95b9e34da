"""Bad input gets a clear 4xx (or the spec's 5xx for a failing get_tools)
and leaves no record behind; an unavailable store is a 503, never a 500."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from rollout_core.store.schema import MemoryField
from rollout_fleet.redis_server import RedisServer
from rollout_gateway.limits import MAX_NESTING
from tests.conftest import TEST_ENV, v2_fleet
from tests.harness import (
    SCRIPTED_AGENT,
    SCRIPTED_V2_AGENT,
    FleetUnderTest,
    MockTrainGateClient,
    V2FleetUnderTest,
    script,
)


def no_record(fleet: FleetUnderTest, key: str) -> bool:
    return fleet.redis.exists(fleet.record_key(key)) == 0


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'{"rollout_id": "x", "server_url": ', "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b"\xff\xfe not utf-8", "application/json"),
        (b'"just a string"', "application/json"),
        (b"rollout_id=x", "application/x-www-form-urlencoded"),
        (b"", "application/json"),
    ],
)
def test_malformed_bodies_are_422(fleet: FleetUnderTest, content: bytes, content_type: str) -> None:
    response = fleet.http.post(
        "/v1/rollout/init", content=content, headers={"Content-Type": content_type}
    )
    assert response.status_code == 422
    assert response.json()["detail"]


def test_get_tools_that_hangs_is_a_clear_500_and_leaves_nothing(fleet: FleetUnderTest) -> None:
    body = fleet.body(metadata={"get_tools": "hang", "hang_s": 5})
    response = fleet.init(body)
    assert response.status_code == 500
    assert response.json() == {"detail": "get_tools() did not return within 2s"}
    assert no_record(fleet, body["rollout_id"])
    body["metadata"] = {}
    assert fleet.init(body).status_code == 202
    fleet.wait_delivered([body["rollout_id"]])


def test_get_tools_returning_an_invalid_tool_is_a_clear_500(fleet: FleetUnderTest) -> None:
    body = fleet.body(metadata={"get_tools": "invalid"})
    response = fleet.init(body)
    assert response.status_code == 500
    assert "invalid tool list" in response.json()["detail"]
    assert "name" in response.json()["detail"]
    assert no_record(fleet, body["rollout_id"])


def test_error_messages_never_echo_the_trainer_key(fleet: FleetUnderTest) -> None:
    body = fleet.body(api_key="sk-live-SECRET", metadata={"get_tools": "raise"})
    body["rollout_id"] = "leaks-sk-live-SECRET"
    response = fleet.init(body)
    assert response.status_code == 500
    assert "sk-live-SECRET" not in response.text
    assert "***" in response.text


def test_an_agent_error_quoting_the_trainer_key_is_stored_and_sent_without_it(
    fleet: FleetUnderTest,
) -> None:
    """An agent whose exception quotes the trainer's API key: the ERROR callback, the record,
    ``GET /v1/rollouts/{id}`` and the worker's log lines (the traceback included) carry
    ``***`` in its place."""
    body = fleet.body(
        api_key="sk-live-AGENTLEAK", metadata=script({"raise": "bad key sk-live-AGENTLEAK"})
    )
    assert fleet.init(body).status_code == 202
    (callback,) = fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]
    assert callback["status"] == "ERROR"
    assert callback["error_message"] == "bad key ***", callback
    view = fleet.http.get(f"/v1/rollouts/{body['rollout_id']}")
    assert "sk-live-AGENTLEAK" not in view.text
    # (the request's own metadata, which quotes it here, is the trainer's to send)
    stored = fleet.redis.hget(fleet.record_key(body["rollout_id"]), "result") or ""
    assert "bad key ***" in stored
    assert "sk-live-AGENTLEAK" not in stored
    worker_logs = "\n".join(
        process.output() for name, process in fleet.fleet.processes.items() if "worker" in name
    )
    assert "Traceback" in worker_logs
    assert "bad key ***" in worker_logs  # the SDK runner's line, with its traceback
    assert "sk-live-AGENTLEAK" not in worker_logs


def test_the_sealed_trainer_key_is_not_in_the_record(fleet: FleetUnderTest) -> None:
    body = fleet.body(
        api_key="sk-live-PLANTED", metadata={"script": [{"sleep": 1}, {"complete": {}}]}
    )
    assert fleet.init(body).status_code == 202
    record = fleet.record(body["rollout_id"])
    assert "sk-live-PLANTED" not in str(record)
    assert record["secret"]  # sealed, present while the rollout runs
    fleet.wait_status(body["rollout_id"], {"success"})
    assert not fleet.record(body["rollout_id"]).get("secret")  # emptied by the last write


@pytest.fixture
def doomed_store(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    mock_trainer: MockTrainGateClient,
) -> Iterator[tuple[FleetUnderTest, RedisServer]]:
    """A fleet on a Redis of its own (v1 unless parametrized with "v2")."""
    from rollout_fleet.local import LocalFleet

    v2 = getattr(request, "param", "v1") == "v2"
    server = RedisServer().start()
    fleet = LocalFleet(
        SCRIPTED_V2_AGENT if v2 else SCRIPTED_AGENT,
        server.url,
        workers=1,
        env=TEST_ENV,
        log_dir=tmp_path_factory.mktemp("doomed"),
    )
    handle = (V2FleetUnderTest if v2 else FleetUnderTest)(fleet, mock_trainer)
    fleet.start()
    yield handle, server
    handle.close()
    server.stop()


def test_an_unreachable_store_is_503_with_retry_after(
    doomed_store: tuple[FleetUnderTest, RedisServer],
) -> None:
    fleet, server = doomed_store
    server.stop()
    response = fleet.init(fleet.body())
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert "rollout store unavailable" in response.json()["detail"]
    assert fleet.http.get("/health").status_code == 503


def while_full(fleet: FleetUnderTest, send: Callable[[], httpx.Response]) -> httpx.Response:
    """``send`` while the fleet's Redis is at ``maxmemory`` (it refuses every write)."""
    fleet.redis.config_set("maxmemory", "1")
    try:
        return send()
    finally:
        fleet.redis.config_set("maxmemory", "0")


def test_a_full_store_is_503_and_writes_nothing(
    doomed_store: tuple[FleetUnderTest, RedisServer],
) -> None:
    """Redis at ``maxmemory`` (noeviction) refuses writes: v1 has no 429 (CONFORMANCE #47),
    so this 503 is what bounds its queue."""
    fleet, _ = doomed_store
    body = fleet.body()
    response = while_full(fleet, lambda: fleet.init(body))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert "full" in response.json()["detail"]
    assert fleet.redis.exists(fleet.record_key(body["rollout_id"])) == 0
    assert fleet.init(body).status_code == 202  # room again: the same request is admitted
    assert len(fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]) == 1


@pytest.mark.parametrize("doomed_store", ["v2"], indirect=True)
def test_a_full_store_tells_a_v2_trainer_to_come_back(
    doomed_store: tuple[V2FleetUnderTest, RedisServer],
) -> None:
    """#70's answer, so the trainer's client waits and retries instead of giving up."""
    fleet, _ = doomed_store
    body = fleet.body()
    response = while_full(fleet, lambda: fleet.admit(body))
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "5"
    assert response.json() == {"detail": "rollout queue is full; retry later"}
    assert fleet.redis.exists(fleet.record_key(body["rollout_id"])) == 0
    response = fleet.admit(body)
    assert response.status_code == 202
    assert fleet.result(body["rollout_id"], response.json()["polling_lease_token"])["status"] == (
        "success"
    )


@pytest.mark.parametrize("doomed_store", ["v1", "v2"], indirect=True)
def test_no_room_for_admitted_rollouts_to_end_refuses_before_redis_is_full(
    doomed_store: tuple[FleetUnderTest, RedisServer],
) -> None:
    """Redis has 4 MiB free, but this fleet's finishes have added 10 MB each: it would take
    the admission, not its result (the room kept, docs/OPERATIONS.md). The admission is
    refused as a full store's (v1 503, v2 429), nothing written; with room again, taken."""
    fleet, _ = doomed_store
    v2 = isinstance(fleet, V2FleetUnderTest)
    body = fleet.body()
    send = (lambda: fleet.admit(body)) if v2 else (lambda: fleet.init(body))
    figures = fleet.keys.memory
    used = int(fleet.redis.info("memory")["used_memory"])
    fleet.redis.config_set("maxmemory", str(used + 4 * 2**20))
    fleet.redis.hset(figures, MemoryField.FINISH_BYTES, str(10_000_000))
    try:
        time.sleep(1.5)  # the gateway's figures are read every 0.5 s
        response = send()
        assert int(fleet.redis.info("memory")["used_memory"]) < used + 4 * 2**20  # not full
    finally:
        fleet.redis.config_set("maxmemory", "0")
        fleet.redis.hdel(figures, MemoryField.FINISH_BYTES)
    assert response.status_code == (429 if v2 else 503), response.text
    assert response.headers["Retry-After"] == "5"
    assert fleet.redis.exists(fleet.record_key(body["rollout_id"])) == 0
    time.sleep(1.5)
    assert send().status_code == 202
    assert "admissions refused: Redis lacks" in fleet.logs()


def test_a_gateway_dying_mid_admission_does_not_block_the_key(fleet: FleetUnderTest) -> None:
    """A crashed admission leaves a pending record; once it lapses a retry is admitted."""
    body = fleet.body()
    record = fleet.record_key(body["rollout_id"])
    fleet.redis.hset(record, mapping={"status": "admitting", "admit_token": "crashed-gateway"})
    fleet.redis.pexpire(record, 1000)
    response = fleet.init(body)
    assert response.status_code == 202
    assert response.json()["rollout_id"] == body["rollout_id"]
    assert len(fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]) == 1


@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_a_non_finite_number_in_the_body_is_422_not_500(
    fleet: FleetUnderTest, literal: str
) -> None:
    text = json.dumps(fleet.body())[:-1] + f', "max_turns": {literal}}}'
    response = fleet.http.post(
        "/v1/rollout/init", content=text, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "max_turns"]


def test_an_idempotency_key_is_bounded_as_a_rollout_id_is(fleet: FleetUnderTest) -> None:
    """Both become Redis key names: 256 characters are admitted, 257 are a 422 naming it."""
    edge = "é" * 256
    admitted = fleet.init(fleet.body(idempotency_key=edge))
    assert admitted.status_code == 202, admitted.text
    refused = fleet.init(fleet.body(idempotency_key=edge + "x"))
    assert refused.status_code == 422
    (problem,) = refused.json()["detail"]
    assert problem["loc"] == ["body", "idempotency_key"]
    assert "at most 256 characters" in problem["msg"]


def nested(depth: int) -> dict[str, Any]:
    """An object nesting ``depth`` levels of objects."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [MAX_NESTING, 300])
def test_a_request_nested_deeper_than_workers_read_back_is_422_and_writes_nothing(
    fleet: FleetUnderTest, depth: int
) -> None:
    """A v1 request whose metadata nests too deep: a 422 naming the field, no record, no
    admission key left behind (before: admitted, then failed at the worker as unreadable; or
    past 260 levels a 500 that held the id for 15 s). One level less runs."""
    body = fleet.body(metadata={"deep": nested(depth - 1)})
    refused = fleet.init(body)
    assert refused.status_code == 422, refused.text
    (problem,) = refused.json()["detail"]
    assert problem["loc"] == ["body", "metadata"]
    assert f"more than {MAX_NESTING} levels" in problem["msg"]
    assert no_record(fleet, body["rollout_id"])
    body = fleet.body(metadata={"deep": nested(MAX_NESTING - 2)})
    assert fleet.init(body).status_code == 202
    (callback,) = fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]
    assert callback["status"] == "COMPLETED", callback


v2_one = v2_fleet(workers=1, gateways=1)


def test_a_v2_request_nested_too_deep_is_422_and_writes_nothing(
    v2_one: V2FleetUnderTest,
) -> None:
    body = v2_one.body(metadata={"deep": nested(MAX_NESTING)})
    refused = v2_one.admit(body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "metadata"]
    assert v2_one.redis.exists(v2_one.record_key(body["rollout_id"])) == 0


def test_a_v2_agent_error_quoting_the_llm_key_is_stored_polled_and_logged_without_it(
    v2_one: V2FleetUnderTest,
) -> None:
    """A v2 workflow whose exception quotes ``llm_api_key``: the polled result, the record and
    the worker's log lines carry ``***`` in its place."""
    result = v2_one.run(
        llm_api_key="sk-live-V2LEAK",
        metadata={"script": [{"raise": ["RuntimeError", "bad key sk-live-V2LEAK"]}]},
    )
    assert result["status"] == "failure", result
    assert "***" in result["err_message"], result
    assert "sk-live-V2LEAK" not in json.dumps(result)
    stored = v2_one.redis.hget(v2_one.record_key(result["rollout_id"]), "result") or ""
    assert "sk-live-V2LEAK" not in stored
    worker_logs = "\n".join(
        process.output() for name, process in v2_one.fleet.processes.items() if "worker" in name
    )
    assert "Traceback" in worker_logs
    assert "sk-live-V2LEAK" not in worker_logs


@pytest.mark.parametrize("missing", ["server_url", "completion_params"])
def test_a_v1_body_missing_a_field_is_422_without_echoing_keys_or_url_credentials(
    fleet: FleetUnderTest, missing: str
) -> None:
    """A missing field's error shows the whole body: its keys, at any depth, are redacted and
    its URLs lose their credentials (the tool server's too)."""
    body = fleet.body(api_key="sk-live-MISSING")
    body["tool_server_url"] = "http://tools:TOOLPASSWORD@127.0.0.1:9/tools"
    body["metadata"] = {"nested": {"api_key": "sk-live-NESTED"}}
    del body[missing]
    refused = fleet.init(body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", missing]
    for secret in ("sk-live-MISSING", "TOOLPASSWORD", "sk-live-NESTED"):
        assert secret not in refused.text
    assert "<redacted>" in refused.text
    assert "//***@127.0.0.1:9/tools" in refused.text
    assert no_record(fleet, body["rollout_id"])


def test_a_v2_body_missing_its_llm_url_is_422_without_echoing_the_llm_key(
    v2_one: V2FleetUnderTest,
) -> None:
    body = v2_one.body(llm_api_key="sk-live-V2MISSING")
    del body["chat_completions_url"]
    refused = v2_one.admit(body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "chat_completions_url"]
    assert "sk-live-V2MISSING" not in refused.text
    assert "<redacted>" in refused.text
    assert v2_one.redis.exists(v2_one.record_key(body["rollout_id"])) == 0
