"""CONFORMANCE §A — ``POST /v1/rollout/init`` on the real fleet (P§1.3)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.agents.scripted_v1 import TOOLS
from tests.harness import FleetUnderTest, new_id, script


def assert_no_record(fleet: FleetUnderTest, key: str) -> None:
    """Bad input leaves nothing behind (a job is only ever enqueued with its record)."""
    assert fleet.redis.exists(fleet.record_key(key)) == 0


def test_01_minimal_body_returns_202_with_tools_in_p13_shape(fleet: FleetUnderTest) -> None:
    body = fleet.body()
    response = fleet.init(body)
    assert response.status_code == 202
    assert response.json() == {
        "rollout_id": body["rollout_id"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two numbers",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "a": {"type": "number", "description": None, "enum": None},
                            # [decision] extra JSON-Schema keywords survive (lossless).
                            "b": {
                                "type": "number",
                                "description": None,
                                "enum": None,
                                "minimum": 0,
                            },
                            "items": {
                                "type": "array",
                                "description": None,
                                "enum": None,
                                "items": {"type": "integer"},
                            },
                        },
                        "required": ["a", "b"],
                    },
                    "strict": False,
                },
            }
        ],
    }
    fleet.wait_delivered([body["rollout_id"]])


@pytest.mark.parametrize("missing", ["rollout_id", "server_url", "messages", "completion_params"])
def test_02_missing_required_field_is_422(fleet: FleetUnderTest, missing: str) -> None:
    body = fleet.body()
    del body[missing]
    response = fleet.init(body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", missing]


@pytest.mark.parametrize("rollout_id", ["", "   ", "\t\n", "x" * 257])
def test_03_blank_or_overlong_rollout_id_is_422(fleet: FleetUnderTest, rollout_id: str) -> None:
    response = fleet.init(fleet.body(rollout_id))
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "rollout_id"]
    assert_no_record(fleet, rollout_id)


def test_03_a_256_character_rollout_id_is_accepted(fleet: FleetUnderTest) -> None:
    rollout_id = "x" * 255 + "y"
    assert fleet.init(fleet.body(rollout_id)).status_code == 202
    fleet.wait_delivered([rollout_id])


@pytest.mark.parametrize("server_url", ["ftp://h", "http://", "not a url", "https:///path"])
def test_04_server_url_needs_http_scheme_and_host(fleet: FleetUnderTest, server_url: str) -> None:
    body = fleet.body(server_url=server_url)
    response = fleet.init(body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "server_url"]
    assert_no_record(fleet, body["rollout_id"])


def _metadata_of_size(size: int) -> dict[str, str]:
    overhead = len(json.dumps({"pad": ""}))
    metadata = {"pad": "x" * (size - overhead)}
    assert len(json.dumps(metadata)) == size
    return metadata


def test_05_metadata_over_1mib_is_422_and_just_under_is_202(fleet: FleetUnderTest) -> None:
    over = fleet.body(metadata=_metadata_of_size(1_048_577))
    response = fleet.init(over)
    assert response.status_code == 422
    assert "metadata size exceeds maximum allowed size of 1MB" in response.text
    assert_no_record(fleet, over["rollout_id"])

    under = fleet.body(metadata=_metadata_of_size(1_048_576))
    assert fleet.init(under).status_code == 202
    fleet.wait_delivered([under["rollout_id"]])


def test_05_metadata_null_is_422(fleet: FleetUnderTest) -> None:
    assert fleet.init(fleet.body(metadata=None)).status_code == 422


def _echoed_request(fleet: FleetUnderTest, body: dict[str, Any]) -> dict[str, Any]:
    delivered = fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]][0]
    echo = next(m for m in delivered["final_messages"] if m["role"] == "assistant")
    echoed: dict[str, Any] = json.loads(echo["content"])
    return echoed


def test_06_optional_fields_take_their_defaults(fleet: FleetUnderTest) -> None:
    body = fleet.body()  # the four required fields only
    assert fleet.init(body).status_code == 202
    echoed = _echoed_request(fleet, body)
    assert echoed["max_turns"] == 10
    assert echoed["max_tokens_total"] == 8192
    assert echoed["metadata"] == {}
    assert echoed["tool_server_url"] is None
    assert echoed["idempotency_key"] is None


def test_07_property_without_description_or_enum_is_null_and_strict_false(
    fleet: FleetUnderTest,
) -> None:
    tools = fleet.init(fleet.body()).json()["tools"]
    properties = tools[0]["function"]["parameters"]["properties"]
    assert properties["a"]["description"] is None
    assert properties["a"]["enum"] is None
    assert tools[0]["function"]["strict"] is False
    assert TOOLS[0]["function"].get("strict") is None  # the agent never set it


def _calls_for(fleet: FleetUnderTest, rollout_id: str) -> list[dict[str, Any]]:
    return fleet.trainer.calls("chat", rollout_id)


def test_08_duplicate_while_running_replays_202_and_runs_once(fleet: FleetUnderTest) -> None:
    body = fleet.body(metadata=script({"chat": {}}, {"sleep": 1.0}, {"complete": {}}))
    first = fleet.init(body)
    fleet.wait_status(body["rollout_id"], {"running"})
    second = fleet.init(body)
    assert first.status_code == second.status_code == 202
    assert first.content == second.content
    deliveries = fleet.wait_delivered([body["rollout_id"]])
    assert len(deliveries[body["rollout_id"]]) == 1
    assert len(_calls_for(fleet, body["rollout_id"])) == 1


def test_09_duplicate_after_completion_replays_and_does_not_rerun(fleet: FleetUnderTest) -> None:
    body = fleet.body()
    first = fleet.init(body)
    fleet.wait_delivered([body["rollout_id"]])
    fleet.wait_status(body["rollout_id"], {"success"})
    again = fleet.init(body)
    assert again.status_code == 202
    assert again.content == first.content
    assert len(fleet.trainer.deliveries()[body["rollout_id"]]) == 1
    assert len(_calls_for(fleet, body["rollout_id"])) == 1


def test_10_same_idempotency_key_replays_the_first_rollout_id(fleet: FleetUnderTest) -> None:
    key = new_id("idem")
    first = fleet.body(idempotency_key=key)
    second = fleet.body(idempotency_key=key)  # a different rollout_id
    assert first["rollout_id"] != second["rollout_id"]
    a, b = fleet.init(first), fleet.init(second)
    assert a.status_code == b.status_code == 202
    assert a.json()["rollout_id"] == b.json()["rollout_id"] == first["rollout_id"]
    fleet.wait_delivered([first["rollout_id"]])
    fleet.wait_status(key, {"success"})
    assert second["rollout_id"] not in fleet.trainer.deliveries()
    assert len(fleet.trainer.deliveries()[first["rollout_id"]]) == 1


def test_11_different_idempotency_keys_are_independent(fleet: FleetUnderTest) -> None:
    rollout_id = new_id()
    one = fleet.body(rollout_id, idempotency_key=new_id("k"))
    two = fleet.body(rollout_id, idempotency_key=new_id("k"))
    assert fleet.init(one).status_code == fleet.init(two).status_code == 202
    fleet.wait_status(one["idempotency_key"], {"success"})
    fleet.wait_status(two["idempotency_key"], {"success"})
    assert len(fleet.trainer.deliveries()[rollout_id]) == 2


def test_12_get_tools_raising_is_500_and_the_key_is_forgotten(fleet: FleetUnderTest) -> None:
    body = fleet.body(metadata={"get_tools": "raise"})
    failed = fleet.init(body)
    assert failed.status_code == 500
    assert "get_tools() raised RuntimeError" in failed.json()["detail"]
    assert_no_record(fleet, body["rollout_id"])

    body["metadata"] = {}
    retried = fleet.init(body)
    assert retried.status_code == 202
    assert len(fleet.wait_delivered([body["rollout_id"]])[body["rollout_id"]]) == 1


def test_14_202_comes_back_before_the_agent_finishes(fleet: FleetUnderTest) -> None:
    body = fleet.body(metadata=script({"sleep": 5}, {"complete": {}}))
    assert fleet.init(body).status_code == 202
    # The 202 is already here; the rollout is still in flight and nothing was delivered.
    assert fleet.record(body["rollout_id"])["status"] in {"queued", "running"}
    assert body["rollout_id"] not in fleet.trainer.deliveries()
    fleet.wait_delivered([body["rollout_id"]])


def test_15_tool_without_description_is_accepted_with_empty_description(
    fleet: FleetUnderTest,
) -> None:
    response = fleet.init(fleet.body(metadata={"get_tools": "no_description"}))
    assert response.status_code == 202
    function = response.json()["tools"][0]["function"]
    assert function["description"] == ""
    assert function["parameters"] == {"type": "object", "properties": {}, "required": []}


def test_concurrent_duplicates_run_once_and_replay_one_body(fleet: FleetUnderTest) -> None:
    """The same rollout_id sent ×10 at once — one run, one body."""
    body = fleet.body(metadata=script({"chat": {}}, {"sleep": 0.5}, {"complete": {}}))
    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(lambda _: fleet.init(body), range(10)))
    assert {r.status_code for r in responses} == {202}
    assert len({r.content for r in responses}) == 1
    fleet.wait_delivered([body["rollout_id"]])
    fleet.wait_status(body["rollout_id"], {"success"})
    assert len(fleet.trainer.deliveries()[body["rollout_id"]]) == 1
    assert len(_calls_for(fleet, body["rollout_id"])) == 1
