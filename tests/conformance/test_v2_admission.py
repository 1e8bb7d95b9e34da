"""CONFORMANCE §H — ``POST /rollout`` admission (P§2.3), on two gateways and two workers."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rollout_core.store import Keys
from rollout_sdk.types.protocol import MAX_ROLLOUT_ID_BYTES
from tests.conftest import v2_fleet
from tests.harness import V2FleetUnderTest, new_id

fleet = v2_fleet()
# One worker slot and room for two queued rollouts: the queue fills on purpose.
narrow = v2_fleet(gateways=1, workers=1, concurrency=1, env={"ROLLOUT_FLEET_MAX_QUEUED": "2"})

SLOW = {"script": [{"sleep": 3}]}


def test_63_valid_body_is_202_with_a_lease(fleet: V2FleetUnderTest) -> None:
    body = fleet.body()
    response = fleet.admit(body)
    assert response.status_code == 202
    admission = response.json()
    assert admission.keys() == {
        "rollout_id",
        "status",
        "polling_lease_token",
        "result_wait_timeout_sec",
        "polling_lease_timeout_sec",
    }
    assert admission["rollout_id"] == body["rollout_id"]
    assert admission["status"] == "queued"
    assert len(admission["polling_lease_token"]) == 43
    assert admission["polling_lease_timeout_sec"] > admission["result_wait_timeout_sec"] > 0
    assert fleet.result(body["rollout_id"], admission["polling_lease_token"])["status"] == "success"


@pytest.mark.parametrize("rollout_id", ["a/b", "a\\b", ".", "..", "", "x\u0000y"])
def test_64_rollout_id_must_be_one_path_segment(fleet: V2FleetUnderTest, rollout_id: str) -> None:
    response = fleet.admit(fleet.body(rollout_id))
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "rollout_id"]


def test_64_dots_and_underscores_are_fine(fleet: V2FleetUnderTest) -> None:
    rollout_id = f"run-1.attempt_2-{new_id()}"
    assert fleet.admit(fleet.body(rollout_id)).status_code == 202


@pytest.mark.parametrize("missing", ["rollout_id", "initial_messages", "chat_completions_url"])
def test_65_missing_required_field_is_422(fleet: V2FleetUnderTest, missing: str) -> None:
    body = fleet.body()
    del body[missing]
    assert fleet.admit(body).status_code == 422


def test_66_empty_llm_api_key_is_422_but_omitted_or_null_is_fine(fleet: V2FleetUnderTest) -> None:
    assert fleet.admit(fleet.body(llm_api_key="")).status_code == 422
    assert fleet.admit(fleet.body(llm_api_key=None)).status_code == 202
    assert fleet.admit(fleet.body()).status_code == 202


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["agent_timeout_sec", "grader_timeout_sec"])
def test_67_non_finite_timeouts_are_422(fleet: V2FleetUnderTest, field: str, literal: str) -> None:
    text = json.dumps(fleet.body())[:-1] + f', "{field}": {literal}}}'
    response = fleet.http.post(
        "/rollout", content=text, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422


def test_67_a_zero_timeout_is_admitted_and_times_out(fleet: V2FleetUnderTest) -> None:
    final = fleet.run(agent_timeout_sec=0)
    assert (final["status"], final["err_category"]) == ("failure", "timeout")


def test_68_unknown_fields_are_ignored(fleet: V2FleetUnderTest) -> None:
    body = fleet.body(completion_callback_url="http://cb.example/x", foo={"bar": 1})
    assert fleet.admit(body).status_code == 202


def test_69_a_registered_id_is_409_while_queued_running_or_retained(
    fleet: V2FleetUnderTest,
) -> None:
    rollout_id, token = fleet.admitted(metadata=SLOW)
    duplicate = fleet.admit(fleet.body(rollout_id))
    assert duplicate.status_code == 409
    assert duplicate.json() == {"detail": "rollout_id is already registered"}
    fleet.result(rollout_id, token)
    assert fleet.admit(fleet.body(rollout_id)).status_code == 409


def test_70_a_full_queue_is_429_with_retry_after_until_capacity_frees(
    narrow: V2FleetUnderTest,
) -> None:
    running = narrow.admitted(metadata=SLOW)
    narrow.wait_status(running[0], {"running"})
    queued = [narrow.admitted(metadata={"script": []}) for _ in range(2)]
    refused = narrow.admit(narrow.body())
    assert refused.status_code == 429
    assert refused.json() == {"detail": "rollout queue is full; retry later"}
    assert refused.headers["Retry-After"] == "5"
    for rollout_id, token in [running, *queued]:
        narrow.result(rollout_id, token)
    assert narrow.admit(narrow.body()).status_code == 202


def test_72_a_full_queue_answers_429_even_for_a_duplicate(narrow: V2FleetUnderTest) -> None:
    running = narrow.admitted(metadata=SLOW)
    narrow.wait_status(running[0], {"running"})
    queued = [narrow.admitted(metadata={"script": []}) for _ in range(2)]
    assert narrow.admit(narrow.body(queued[0][0])).status_code == 429
    for rollout_id, token in [running, *queued]:
        narrow.result(rollout_id, token)


def test_71_and_72_a_draining_fleet_is_503_even_for_a_duplicate(narrow: V2FleetUnderTest) -> None:
    known, _ = narrow.admitted(metadata={"script": []})
    drained = narrow.http.post("/drain", json={"timeout_sec": 5})
    assert drained.status_code == 200
    assert drained.json()["accepting_rollouts"] is False
    try:
        refused = narrow.admit(narrow.body())
        assert refused.status_code == 503
        assert refused.json() == {"detail": "rollout server is shutting down"}
        assert narrow.admit(narrow.body(known)).status_code == 503
        assert narrow.http.get("/health").json()["lifecycle"]["accepting_rollouts"] is False
    finally:
        assert narrow.http.delete("/drain").json()["accepting_rollouts"] is True
    assert narrow.admit(narrow.body()).status_code == 202


def test_73_a_rollout_is_scheduled_before_its_202_is_written(fleet: V2FleetUnderTest) -> None:
    """The client hangs up before reading the 202: the rollout still runs (the mock gets its
    call), and since nobody polls it ends by lease expiry rather than running forever."""
    body = fleet.body(metadata={"script": [{"chat": {}}, {"sleep": 600}]})
    payload = json.dumps(body).encode()
    url = urlsplit(fleet.fleet.gateway_url)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(
            b"POST /rollout HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
    deadline = time.monotonic() + 30
    while not fleet.trainer.calls("chat", body["rollout_id"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fleet.trainer.calls("chat", body["rollout_id"]), "the abandoned rollout never ran"
    record = fleet.record(body["rollout_id"])
    assert record["status"] == "running"
    deadline = fleet.redis.zscore(
        Keys(fleet.prefix).polling_leases, fleet.record_key(body["rollout_id"])
    )
    assert deadline is not None  # it ends at lease expiry (see test_v2_leases)
    assert deadline > 0


# Item 153: a rollout id holds at most 255 bytes of UTF-8. The widest characters take 4 bytes
# each (12 percent-encoded, in a poll's path and an LLM call's header).
WIDEST = "\U0001f600"


def sized_id(size: int) -> str:
    """A fresh id of ``size`` bytes of UTF-8, as many 4-byte characters as fit."""
    unique = new_id()
    rest = size - len(unique)
    return WIDEST * (rest // 4) + "x" * (rest % 4) + unique


def test_153_an_id_at_the_limit_is_admitted_run_polled_and_cancelled(
    fleet: V2FleetUnderTest, artifact_root: Path
) -> None:
    ran, cancelled = sized_id(MAX_ROLLOUT_ID_BYTES), sized_id(MAX_ROLLOUT_ID_BYTES)
    assert len(ran.encode()) == MAX_ROLLOUT_ID_BYTES
    assert ran.count(WIDEST) == 60  # 255 bytes: 60 emoji, one byte more and the new_id
    final = fleet.result(*fleet.admitted(rollout_id=ran))  # polled by the percent-encoded id
    assert (final["rollout_id"], final["status"]) == (ran, "success")
    assert final["sample"]["reward"] == 1.0
    (call,) = fleet.trainer.calls("chat", ran)
    assert call["x_rollout_id"] == ran  # P§2.11: the header names it, percent-encoded
    assert (artifact_root / ran / "artifacts").is_dir()  # a file name's limit: it fits

    token = fleet.admitted(rollout_id=cancelled, metadata=SLOW)[1]
    fleet.wait_status(cancelled, {"running"})
    response = fleet.http.post("/rollout/cancel", json={"ids": [cancelled]})
    assert response.json() == {"dispositions": {cancelled: "cancelled_running"}}
    assert fleet.result(cancelled, token)["status"] == "cancelled"


@pytest.mark.parametrize("size", [MAX_ROLLOUT_ID_BYTES + 1, 3_000_000])
def test_153_an_id_past_the_limit_is_refused_in_one_line(
    fleet: V2FleetUnderTest, size: int
) -> None:
    rollout_id = sized_id(size)
    response = fleet.admit(fleet.body(rollout_id))
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "rollout_id"]
    assert error["msg"] == (
        f"Value error, rollout_id must be at most {MAX_ROLLOUT_ID_BYTES} bytes of UTF-8; "
        f"this one has {size}"
    )
    assert len(response.content) < 1000  # the id is not echoed back
    assert not fleet.record(rollout_id)
