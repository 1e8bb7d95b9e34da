"""Hostile and odd input: deep JSON, huge metadata, path-traversal and unicode rollout ids,
bad lease tokens, replayed and concurrent duplicate admissions. The gateway answers each
with a 4xx and a message (never a 5xx), writes nothing for a refused request and exactly one
record for a duplicated one, and goes on serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness import LEASE_HEADER, FleetUnderTest, new_id
from tests.security.conftest import admit

ODD_IDS = [
    "../../etc/passwd",
    "a/b",
    "..",
    "a\\b",
    "nul\x00byte",
    "line\nbreak",
    "%2e%2e%2fadmin",
    "ｒｏｌｌｏｕｔ-全角-🚀",
    "",
    " ",
    "x" * 5000,
]


def assert_serving(handle: FleetUnderTest) -> None:
    body = handle.body()
    assert admit(handle, body).status_code == 202
    handle.wait_status(body["rollout_id"], {"success"})


def test_deeply_nested_json_is_a_4xx(locked: FleetUnderTest) -> None:
    depth = 50_000
    raw = '{"rollout_id": "deep", "metadata": ' + "[" * depth + "]" * depth + "}"
    path = "/v1/rollout/init" if locked.protocol == "v1" else "/rollout"
    response = locked.http.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert locked.redis.exists(locked.record_key("deep")) == 0
    assert_serving(locked)


def test_huge_metadata_under_the_limit_is_admitted_whole(locked: FleetUnderTest) -> None:
    metadata = {f"k{i}": "v" * 10 for i in range(10_000)}  # ~170 KB, under the 256 KiB limit
    body = locked.body(new_id("meta"), metadata=metadata)
    assert admit(locked, body).status_code == 202
    stored = locked.record(body["rollout_id"])["request"]
    assert f'"k9999":"{"v" * 10}"' in stored


@pytest.mark.parametrize("rollout_id", ODD_IDS, ids=range(len(ODD_IDS)))
def test_odd_rollout_ids_are_refused_or_kept_verbatim(
    locked: FleetUnderTest, rollout_id: str
) -> None:
    before = set(locked.redis.scan_iter(f"{locked.keys.records_of(locked.protocol)}*"))
    response = admit(locked, locked.body(rollout_id))
    assert response.status_code in (202, 422), response.text
    after = set(locked.redis.scan_iter(f"{locked.keys.records_of(locked.protocol)}*"))
    if response.status_code == 422:
        assert after <= before  # nothing written
        assert response.json()["detail"]
    else:
        assert locked.redis.hget(locked.record_key(rollout_id), "rollout_id") == rollout_id


@pytest.mark.parametrize("rollout_id", ["..", "%2e%2e", "ｒｏｌｌｏｕｔ", "x" * 5000])
def test_odd_ids_in_the_poll_path_are_a_4xx(locked_v2: FleetUnderTest, rollout_id: str) -> None:
    response = locked_v2.http.get(f"/rollout/{rollout_id}/result", headers={LEASE_HEADER: "t"})
    assert 400 <= response.status_code < 500, response.text


def test_bad_lease_tokens_are_refused_and_change_nothing(locked_v2: FleetUnderTest) -> None:
    rollout_id, token = locked_v2.admitted()
    other_id, other_token = locked_v2.admitted()
    record = locked_v2.record_key(rollout_id)
    for bad in ["", "garbage", token.upper(), token + "x", "t" * 10_000, other_token]:
        response = locked_v2.poll(rollout_id, bad)
        assert 400 <= response.status_code < 500, (bad[:20], response.text)
    missing = locked_v2.http.get(f"/rollout/{rollout_id}/result")
    assert 400 <= missing.status_code < 500
    assert locked_v2.result(rollout_id, token)["status"] == "success"
    assert locked_v2.redis.hget(record, "terminations") == "1"
    assert locked_v2.result(other_id, other_token)["status"] == "success"


def test_replayed_and_concurrent_duplicates_admit_once(locked: FleetUnderTest) -> None:
    body = locked.body(new_id("dup"))
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: admit(locked, body), range(32)))
    replay = admit(locked, body)
    codes = sorted(response.status_code for response in [*answers, replay])
    if locked.protocol == "v1":  # idempotent: every duplicate gets the first 202's body
        assert codes == [202] * 33
        assert len({response.text for response in [*answers, replay]}) == 1
        deliveries = locked.wait_delivered([body["rollout_id"]])
        assert len(deliveries[body["rollout_id"]]) == 1
    else:  # one 202, a 409 for every other
        assert codes == [202] + [409] * 32
        locked.wait_status(body["rollout_id"], {"success"})
    assert locked.redis.hget(locked.record_key(body["rollout_id"]), "attempt") == "1"
