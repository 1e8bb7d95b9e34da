"""The promise for inputs nobody scripted: Hypothesis draws v1 rollouts — ids, idempotency
keys and API keys of any characters the schema accepts, a trainer that answers or a foreign
service that refuses with a secret in its body, agents that succeed, raise, return an error,
hang past the fleet's limit, or answer huge, non-ASCII or control-character output — and
drives a real gateway, two workers, redis-server and the mock TrainGate with each batch.

After every example: each admitted rollout ended within a bound, made terminal once; the
trainer got exactly one callback, carrying the admission's ``Idempotency-Key`` and agreeing
with the record; a successful one is right for its request (what the scripted agent and the
mock's calculator give for its messages: ``_assert_right``); a rollout sent to the foreign
service ended with ``delivery: failed``; and no API key or foreign body is in any view or
record field. A v2 success is right for its row too (``_assert_right_v2``).

CI runs ``ROLLOUT_FLEET_PROPERTY_EXAMPLES`` examples (default 40); the full run is
``ROLLOUT_FLEET_PROPERTY_EXAMPLES=500 uv run pytest tests/delivery/test_properties.py``.
A failing example is kept in ``tests/delivery/property-examples/`` (commit it: it is
replayed first from then on).
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from rollout_sdk.testing.responders import calculator_responder
from tests.conftest import V2_ENV, StartFleet
from tests.harness import (
    LEASE_HEADER,
    SCRIPTED_V2_AGENT,
    FleetUnderTest,
    InternalService,
    V2FleetUnderTest,
    script,
)

EXAMPLES = int(os.environ.get("ROLLOUT_FLEET_PROPERTY_EXAMPLES", "40"))
MAX_ROLLOUT_SECONDS = 3
ENDS_WITHIN = 45  # seconds: the rollout limit, the client's retries, a loaded machine
FOREIGN_SECRET = "internal-secret-4f1c"
TERMINAL = {"success", "failure", "cancelled"}
FOREIGN = {"foreign-404": 404, "foreign-500": 500}
DATABASE = DirectoryBasedExampleDatabase(Path(__file__).parent / "property-examples")
# An example takes about a second (a hanging agent: its limit); the suite's 300 s would cut
# a full run short.
pytestmark = pytest.mark.timeout(120 + 10 * EXAMPLES)


@pytest.fixture(scope="module")
def foreign() -> Iterator[dict[str, str]]:
    """Internal services answering 404 and 500 with a secret: trainer URLs by name."""
    services = {name: InternalService(status, FOREIGN_SECRET) for name, status in FOREIGN.items()}
    yield {name: service.url for name, service in services.items()}
    for service in services.values():
        service.close()


@pytest.fixture(scope="module")
def fleet(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    handle = start_fleet(
        workers=2, env={"ROLLOUT_FLEET_MAX_ROLLOUT_SECONDS": str(MAX_ROLLOUT_SECONDS)}
    )
    yield handle
    handle.close()


# --- what Hypothesis draws ---------------------------------------------------------------------

# Any text JSON can carry: every plane, control characters, CR/LF, NUL.
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
# A Bearer token: what a key may be (anything else is refused at admission, tested apart).
bearer = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=60).map(
    lambda text: f"sk-drawn-{text}"
)

outcome = st.sampled_from(["complete", "chat", "raise", "error", "hang", "huge"])


@dataclass(frozen=True)
class Drawn:
    rollout_id: str
    idempotency_key: str | None
    api_key: str | None
    outcome: str
    text: str  # what the agent says (non-ASCII, control characters...)
    trainer: str  # "mock", "foreign-404" or "foreign-500"

    @property
    def key(self) -> str:
        return self.idempotency_key if self.idempotency_key is not None else self.rollout_id


rollouts = st.builds(
    Drawn,
    rollout_id=any_text,
    idempotency_key=st.none() | any_text,
    api_key=st.none() | bearer,
    outcome=outcome,
    text=any_text,
    trainer=st.sampled_from(["mock", "mock", "mock", "foreign-404", "foreign-500"]),
)


def _steps(drawn: Drawn) -> list[dict[str, Any]]:
    """The agent's script; what it says comes from the request's messages (``_messages``)."""
    if drawn.outcome == "chat":
        return [{"chat": {}}, {"complete": {}}]
    if drawn.outcome == "raise":
        return [{"raise": drawn.text or "boom"}]
    if drawn.outcome == "error":
        return [{"error": drawn.text or "failed"}]
    if drawn.outcome == "hang":
        return [{"sleep": MAX_ROLLOUT_SECONDS + 30}]
    return [{"echo_request": True}, {"complete": {"reward": 1.0}}]


def _messages(drawn: Drawn) -> list[dict[str, Any]]:
    text = drawn.text or "x"
    if drawn.outcome == "huge":  # ~100 KB, twice in the result (the request is echoed)
        text = text * (100_000 // len(text))
    return [{"role": "user", "content": text}]


def _unique(text: str, limit: int) -> str:
    return f"{text}-{uuid.uuid4().hex[:10]}"[-limit:]


# --- the property ------------------------------------------------------------------------------


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=DATABASE,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(rollouts, min_size=1, max_size=6))
@example(batch=[Drawn("rollout-é-1", None, None, "chat", "", "mock")])
@example(batch=[Drawn("plain", "line\r\nbreak", "sk-drawn-1", "complete", "ü\x00\x1b", "mock")])
@example(batch=[Drawn("🚀", "🔑", None, "chat", "", "foreign-404")])
def test_every_admitted_rollout_ends_once_and_shows_no_secret(
    fleet: FleetUnderTest, foreign: dict[str, str], batch: list[Drawn]
) -> None:
    drawn = [
        Drawn(
            _unique(d.rollout_id, 256),
            None if d.idempotency_key is None else _unique(d.idempotency_key, 256),
            d.api_key,
            d.outcome,
            d.text,
            d.trainer,
        )
        for d in batch
    ]
    for d in drawn:
        server_url = foreign.get(d.trainer, fleet.trainer.url)
        fields: dict[str, Any] = {"metadata": script(*_steps(d)), "messages": _messages(d)}
        if d.idempotency_key is not None:
            fields["idempotency_key"] = d.idempotency_key
        if d.api_key is not None:
            fields["api_key"] = d.api_key
        body = fleet.body(d.rollout_id, server_url=server_url, **fields)
        response = fleet.init(body)
        assert response.status_code == 202, (d, response.text)

    deadline = time.monotonic() + ENDS_WITHIN
    records = {}
    for d in drawn:
        while True:
            record = fleet.record(d.key)
            if record.get("status") in TERMINAL:
                break
            assert time.monotonic() < deadline, (d, record, fleet.logs())
            time.sleep(0.1)
        records[d.key] = record
    time.sleep(0.3)  # a repeated callback, if any, would arrive now
    deliveries = fleet.trainer.deliveries()
    for d in drawn:
        _check(fleet, d, records[d.key], deliveries.get(d.rollout_id, []))


def _check(
    fleet: FleetUnderTest, d: Drawn, record: dict[str, str], callbacks: list[dict[str, Any]]
) -> None:
    assert record["terminations"] == "1", (d, record)
    if d.trainer == "mock":
        assert len(callbacks) == 1, (d, callbacks, record)
        (callback,) = callbacks
        assert record["delivery"] == "delivered", (d, record)
        expected = "COMPLETED" if record["status"] == "success" else "ERROR"
        assert callback["status"] == expected, (d, callback, record)
        if d.outcome in ("raise", "error", "hang"):
            assert record["status"] == "failure", (d, record)
        if callback["status"] == "COMPLETED":
            _assert_right(d, callback)
        (call,) = fleet.trainer.calls("completed", d.rollout_id)
        headers = {k.lower(): v for k, v in call["headers"].items()}
        assert headers["idempotency-key"] == record["admit_token"], (d, headers)
    else:
        assert callbacks == [], d
        assert record["delivery"].startswith("failed: the trainer answered HTTP "), (d, record)
    shown = [json.dumps(record, ensure_ascii=False)]
    if "/" not in d.key:
        view = fleet.http.get(f"/v1/rollouts/{quote(d.key, safe='')}")
        assert view.status_code == 200, (d, view.text)
        shown.append(view.text)
        shown.append(json.dumps(view.json(), ensure_ascii=False))
    for text in shown:
        assert FOREIGN_SECRET not in text, (d, text)
        if d.api_key is not None:
            assert d.api_key not in text, (d, text)


def _assert_right(d: Drawn, callback: dict[str, Any]) -> None:
    """A successful callback carries what the agent's script makes of the request's messages:
    the calculator mock's answer to them (``chat``), or the request echoed with reward 1.0."""
    messages = _messages(d)
    final = callback["final_messages"]
    if d.outcome == "chat":
        assert final == [*messages, calculator_responder(messages).message()], (d, callback)
        return
    assert d.outcome in ("complete", "huge"), (d, callback)  # the others never succeed
    assert final[:-1] == messages, (d, callback)
    assert [m["role"] for m in final[-1:]] == ["assistant"], (d, callback)
    echoed = json.loads(final[-1]["content"])
    seen = (echoed["rollout_id"], echoed["messages"], echoed["metadata"])
    assert seen == (d.rollout_id, messages, script(*_steps(d))), (d, echoed)
    assert callback["reward"] == 1.0, (d, callback)


# --- v2: one terminal result, the same on every poll -------------------------------------------

# A v2 id becomes a URL path segment and a file name: anything but '/', '\' and NUL.
segment = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="/\\\x00"), max_size=40
)
v2_outcome = st.sampled_from(["chat", "raise", "hang", "echo", "grader_raises", "reward_nan"])


@dataclass(frozen=True)
class DrawnV2:
    rollout_id: str
    llm_api_key: str | None
    outcome: str
    label: str


def _v2_metadata(drawn: DrawnV2) -> dict[str, Any]:
    workflow: dict[str, list[dict[str, Any]]] = {
        "chat": [{"chat": {}}],
        "raise": [{"raise": ["ValueError", drawn.label or "boom"]}],
        "hang": [{"sleep": 60}],
        "echo": [{"echo": True}],
        "grader_raises": [{"chat": {}}],
        "reward_nan": [{"chat": {}}],
    }
    grade = {
        "grader_raises": [{"raise": ["RuntimeError", "grader"]}],
        "reward_nan": [{"reward": "nan"}],
    }
    return {"script": workflow[drawn.outcome], "grade": grade.get(drawn.outcome, [{"reward": 1.0}])}


@pytest.fixture(scope="module")
def v2_fleet(start_fleet: StartFleet) -> Iterator[V2FleetUnderTest]:
    handle = start_fleet(
        SCRIPTED_V2_AGENT, workers=2, gateways=2, env=V2_ENV, handle=V2FleetUnderTest
    )
    assert isinstance(handle, V2FleetUnderTest)
    yield handle
    handle.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=DATABASE,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batch=st.lists(
        st.builds(DrawnV2, segment, st.none() | bearer, v2_outcome, any_text),
        min_size=1,
        max_size=6,
    )
)
@example(batch=[DrawnV2("rollout-é-1", "sk-drawn-1", "chat", "é\r\n")])
def test_every_admitted_v2_rollout_has_one_result_every_poll_agrees_on(
    v2_fleet: V2FleetUnderTest, batch: list[DrawnV2]
) -> None:
    fleet = v2_fleet
    tokens = {}
    for d in batch:
        rollout_id = _unique(d.rollout_id, 200)
        fields: dict[str, Any] = {
            "metadata": _v2_metadata(d),
            "label": d.label,
            "chat_completions_url": f"{fleet.trainer.url}/v1/rollouts/{quote(rollout_id, safe='')}",
            "agent_timeout_sec": 3,
        }
        if d.llm_api_key is not None:
            fields["llm_api_key"] = d.llm_api_key
        row = fleet.body(rollout_id, **fields)
        response = fleet.admit(row)
        assert response.status_code == 202, (d, response.text)
        tokens[rollout_id] = (d, response.json()["polling_lease_token"], row)
    for rollout_id, (d, token, row) in tokens.items():
        path = f"/rollout/{quote(rollout_id, safe='')}/result"
        terminal = []
        deadline = time.monotonic() + ENDS_WITHIN
        for client in itertools.cycle([fleet.http, fleet.poller]):
            response = client.get(path, headers={LEASE_HEADER: token})
            assert response.status_code == 200, (d, response.text)
            body = response.json()
            if body["status"] in TERMINAL:
                terminal.append(response.text)
                if len(terminal) == 3:  # each gateway, then the first again
                    break
            assert time.monotonic() < deadline, (d, body, fleet.logs())
        assert len(set(terminal)) == 1, (d, terminal)
        record = fleet.record(rollout_id)
        result = json.loads(terminal[0])
        assert result["status"] == record["status"], (d, result, record)
        assert record["terminations"] == "1", (d, record)
        if d.outcome in ("raise", "hang"):
            assert result["status"] == "failure", (d, result)
        if d.outcome in ("chat", "echo"):  # any id names its LLM calls (P§2.11)
            assert result["status"] == "success", (d, result)
            _assert_right_v2(d, row, result)
        if d.llm_api_key is not None:
            for text in (terminal[0], json.dumps(record, ensure_ascii=False)):
                assert d.llm_api_key not in text, (d, text)


def _assert_right_v2(d: DrawnV2, row: dict[str, Any], result: dict[str, Any]) -> None:
    """A success carries what the workflow makes of the row: its prompt and the calculator
    mock's answer to it (``chat``) or what the workflow saw (``echo``), its label, and the
    reward its grader gives (1.0)."""
    prompt = row["initial_messages"]
    sample = result["sample"]
    messages = sample["messages"]
    if d.outcome == "chat":
        assert messages == [*prompt, calculator_responder(prompt).message()], (d, result)
    else:
        assert messages[:-1] == prompt, (d, result)
        assert [m["role"] for m in messages[-1:]] == ["assistant"], (d, result)
        seen = json.loads(messages[-1]["content"])
        assert (seen["prompt"], seen["metadata"]) == (prompt, _v2_metadata(d)), (d, seen)
    assert (sample["label"], sample["reward"]) == (d.label, 1.0), (d, result)
