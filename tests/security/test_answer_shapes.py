"""A chat answer whose message is not the OpenAI shape fails the call where it enters, naming
the field, instead of passing as a success into the rollout's messages. Real gateway,
workers and redis-server; the TrainGate is a local HTTP server answering a well-formed
completion whose message has another role, or content that is not text."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import REPO, FleetUnderTest, V2FleetUnderTest, new_id, script, supervised

ID_HEADERS_AGENT = str(REPO / "tests/agents/id_headers_v2.py")
SHAPES = {
    "role": ({"role": "system", "content": "obey"}, "role"),
    "content": ({"role": "assistant", "content": {"text": "hi"}}, "content"),
}


class TrainGate:
    """Answers every chat call with ``answer`` (of ``content_type``), and every callback with
    200, keeping the callbacks' bodies."""

    def __init__(self, answer: bytes, content_type: str = "application/json") -> None:
        self.callbacks: list[dict[str, Any]] = []
        callbacks = self.callbacks

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                out, kind = answer, content_type
                if self.path.endswith("/rollout/completed"):
                    callbacks.append(json.loads(body))
                    out, kind = b"{}", "application/json"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def completion_of(message: dict[str, Any]) -> bytes:
    answer = {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return json.dumps(answer).encode()


@pytest.fixture(params=list(SHAPES), ids=list(SHAPES))
def odd(request: pytest.FixtureRequest) -> Iterator[tuple[TrainGate, str]]:
    message, field = SHAPES[request.param]
    server = TrainGate(completion_of(message))
    yield server, field
    server.close()


@pytest.fixture(scope="module")
def v1(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    handle = start_fleet(workers=1, env={"OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": "0"})
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def v2(start_fleet: StartFleet) -> Iterator[V2FleetUnderTest]:
    handle = start_fleet(
        ID_HEADERS_AGENT, workers=1, gateways=1, handle=V2FleetUnderTest, env=V2_ENV
    )
    assert isinstance(handle, V2FleetUnderTest)
    yield handle
    handle.close()


def test_a_v1_answer_of_another_shape_fails_its_rollout_naming_the_field(
    v1: FleetUnderTest, odd: tuple[TrainGate, str]
) -> None:
    server, field = odd
    rollout_id = new_id("odd-shape")
    body = v1.body(
        rollout_id, server_url=server.url, metadata=script({"chat": {}}, {"complete": {}})
    )
    assert v1.init(body).status_code == 202
    record = v1.wait_status(rollout_id, {"success", "failure"}, timeout=30)
    assert record["status"] == "failure"
    (callback,) = server.callbacks
    assert callback["status"] == "ERROR"
    assert f"choices.0.message: {field}: Input should be" in callback["error_message"]
    assert callback["final_messages"] == []


def test_a_v2_answer_of_another_shape_fails_its_rollout_naming_the_field(
    v2: V2FleetUnderTest, odd: tuple[TrainGate, str]
) -> None:
    server, field = odd
    result = v2.run(
        chat_completions_url=server.url + "/v1",
        metadata={"path": "openai", "sample": new_id("s")},
    )
    assert result["status"] == "failure"
    assert result["err_category"] == "validation_error"
    assert f"choices.0.message.{field}: Input should be" in result["err_message"]


STRANDS = str(REPO / "examples/strands_multiply/main.py")
STREAMED_TOOL_CALLS = 20_000  # ~4 MiB of chunks: well under the byte cap


def many_tool_calls() -> bytes:
    """One streamed answer of :data:`STREAMED_TOOL_CALLS` tool-call deltas, each its own
    ``index``."""
    event = (
        'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
        '"choices":[{"index":0,"delta":{"tool_calls":[{"index":%d,"id":"c%d",'
        '"type":"function","function":{"name":"multiply","arguments":"{}"}}]}}]}\n\n'
    )
    body = "".join(event % (i, i) for i in range(STREAMED_TOOL_CALLS)) + "data: [DONE]\n\n"
    return body.encode()


def test_a_streamed_answer_of_thousands_of_tool_calls_fails_its_rollout_not_the_worker(
    start_fleet: StartFleet,
) -> None:
    """Twenty thousand streamed tool calls in one answer, a few MiB: a Strands agent would
    run them all at once (the worker's loop stalled for 10 s and it was restarted, its other
    rollouts started over, and the rollout was blamed on the agent). The answer fails at the
    first tool call past the limit, naming the field; the worker never restarts."""
    server = TrainGate(many_tool_calls(), "text/event-stream")
    handle = start_fleet(STRANDS, workers=1, gateways=1, handle=V2FleetUnderTest, env=V2_ENV)
    assert isinstance(handle, V2FleetUnderTest)
    try:
        with supervised(handle.fleet) as restarted:
            result = handle.run(
                initial_messages=[{"role": "user", "content": "6*7?"}],
                chat_completions_url=server.url + "/v1",
                label="42",
            )
        assert result["status"] == "failure"
        assert (
            "choices.0.delta.tool_calls.0.index: Input should be less than 128"
            in (result["err_message"])
        ), result
        assert restarted == []
        view = handle.http.get(f"/v1/rollouts/{result['rollout_id']}").json()
        assert view["attempt"] == 1
    finally:
        handle.close()
        server.close()
