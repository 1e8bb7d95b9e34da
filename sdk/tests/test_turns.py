"""Each chat call's token ids and logprobs, read by the SDK's transport from
the TrainGate's answers (JSON and SSE) while a rollout records its turns."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from rollout_sdk.client import recording_turns
from rollout_sdk.client.sse import SSEDecoder
from rollout_sdk.client.traingate import _ObservedTransport
from rollout_sdk.client.turns import TurnBuilder
from rollout_sdk.context import RolloutContext
from rollout_sdk.integrations.openai_client import rollout_client

pytestmark = pytest.mark.anyio

STREAM = (
    b": ping\n\n"
    b'data: {"prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {"role": '
    b'"assistant", "content": ""}}]}\n\n'
    b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [7, 8], '
    b'"logprobs": {"content": [{"token": "H", "logprob": -0.5}, {"token": "i", "logprob": '
    b"-1.25}]}}]}\r\n\r\n"
    b'data: {"choices": [{"index": 0, "delta": {"content": "\xc3\xa9"}, "token_ids": [9], '
    b'"logprobs": {"content": [{"token": "\xc3\xa9", "logprob": -2.0}]}, "finish_reason": '
    b'"stop"}]}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}\n\n'
    b"data: [DONE]\n\n"
)


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def decode(parts: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    events = [event for part in parts for event in decoder.feed(part)]
    return events + decoder.close()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(STREAM)])
def test_events_do_not_depend_on_where_the_chunks_split(size: int) -> None:
    events = decode(pieces(STREAM, size))
    assert events == decode([STREAM])
    assert len(events) == 5  # the comment is no event
    assert events[-1] == "[DONE]"
    assert json.loads(events[2])["choices"][0]["delta"]["content"] == "é"  # split UTF-8 too


def test_sse_line_endings_multi_line_data_and_other_fields() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: x\rdata: a\r") == []
    assert decoder.feed(b"\ndata:b\r\n") == []  # the CR above and this LF make one line end
    assert decoder.feed(b"id: 4\r\n\r\n") == ["a\nb"]
    assert decoder.feed(b"retry: 1\n\n: only a comment\n\n") == []
    assert decoder.feed(b"data: [DONE]") == []  # the stream ends without its blank line
    assert decoder.close() == ["[DONE]"]
    assert decoder.close() == []


def streamed_turn(parts: list[bytes]) -> dict[str, Any]:
    builder = TurnBuilder()
    for event in decode(parts):
        if event != "[DONE]":
            builder.add(json.loads(event))
    return dict(builder.turn(1.0))


def test_a_stream_adds_up_to_one_turn() -> None:
    turn = streamed_turn(pieces(STREAM, 5))
    assert turn == {
        "token_ids": [7, 8, 9],
        "logprobs": [-0.5, -1.25, -2.0],
        "prompt_token_ids": [1, 2, 3],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
        "finish_reason": "stop",
        "latency_ms": 1.0,
    }


def test_a_json_answer_in_vllms_shape_and_in_the_traingate_dialect() -> None:
    vllm = TurnBuilder()
    vllm.add(
        {
            "prompt_token_ids": [5, 6],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "length",
                    "token_ids": [11, 12],
                    "logprobs": {"content": [{"logprob": -0.1}, {"logprob": 0}]},
                },
                {"index": 1, "token_ids": [99]},  # another choice: not the agent's
            ],
            "usage": {"total_tokens": 4},
        }
    )
    assert (vllm.token_ids, vllm.logprobs, vllm.prompt_token_ids) == ([11, 12], [-0.1, 0], [5, 6])
    assert vllm.finish_reason == "length"
    dialect = TurnBuilder()
    dialect.add({"choices": [{"message": {}}], "token_ids": [1], "logprobs": [-0.3]})
    assert (dialect.token_ids, dialect.logprobs) == ([1], [-0.3])
    without = TurnBuilder()
    without.add({"choices": [{"message": {}, "logprobs": None, "token_ids": None}]})
    assert without.turn(0)["token_ids"] == without.turn(0)["logprobs"] == []
    assert without.turn(0)["finish_reason"] == "stop"


Handler = Callable[[httpx.Request], httpx.Response]


def client_over(handler: Handler, seen: list[httpx.Request]) -> httpx.AsyncClient:
    """An SDK client (its transport) in front of ``handler``."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return httpx.AsyncClient(transport=_ObservedTransport(httpx.MockTransport(answer)))


def trickled(data: bytes, size: int) -> AsyncIterator[bytes]:
    async def parts() -> AsyncIterator[bytes]:
        for part in pieces(data, size):
            yield part

    return parts()


URL = "http://tg.invalid/v1/rollouts/r1/chat/completions"


async def test_the_caller_gets_every_byte_of_a_stream_as_it_is_read() -> None:
    seen: list[httpx.Request] = []
    headers = {"content-type": "text/event-stream"}
    client = client_over(
        lambda _: httpx.Response(200, headers=headers, content=trickled(STREAM, 3)), seen
    )
    with recording_turns() as recorder:
        async with client.stream(
            "POST", URL, json={"messages": [], "stream": True}, headers={"x-sample-id": "s1"}
        ) as response:
            received = b""
            async for part in response.aiter_raw():
                received += part
                if b"[DONE]" not in received:
                    assert recorder.turns == []  # kept once read to the end, not before
    assert received == STREAM
    (turn,) = recorder.turns
    assert (turn["token_ids"], turn["sample_id"]) == ([7, 8, 9], "s1")
    assert json.loads(seen[0].content) == {
        "messages": [],
        "stream": True,
        "return_token_ids": True,
        "logprobs": True,
    }
    assert seen[0].headers["content-length"] == str(len(seen[0].content))


async def test_an_answer_its_caller_abandons_is_not_a_turn() -> None:
    headers = {"content-type": "text/event-stream"}
    client = client_over(
        lambda _: httpx.Response(200, headers=headers, content=trickled(STREAM, 40)), []
    )
    with recording_turns() as recorder:
        async with client.stream("POST", URL, json={"messages": []}) as response:
            async for _ in response.aiter_raw():
                break  # gone before the finish reason came
    assert recorder.turns == []


async def test_a_compressed_json_answer_and_what_the_call_chose_itself() -> None:
    body: dict[str, Any] = {
        "choices": [{"message": {}, "token_ids": [3], "logprobs": None}],
        "usage": {},
    }
    packed = gzip.compress(json.dumps(body).encode())
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    seen: list[httpx.Request] = []
    client = client_over(
        lambda _: httpx.Response(200, headers=headers, content=trickled(packed, 10)), seen
    )
    with recording_turns() as recorder:
        response = await client.post(URL, json={"messages": [], "logprobs": False})
    assert response.json() == body
    assert recorder.turns[0]["token_ids"] == [3]
    assert recorder.turns[0]["sample_id"] is None
    assert json.loads(seen[0].content)["logprobs"] is False  # asked not to: not asked


async def test_nothing_is_asked_or_kept_outside_a_recording_or_from_a_failed_call() -> None:
    seen: list[httpx.Request] = []
    statuses = iter([200, 503, 200])
    client = client_over(
        lambda _: httpx.Response(next(statuses), json={"choices": [], "token_ids": [1]}), seen
    )
    await client.post(URL, json={"messages": []})
    assert json.loads(seen[0].content) == {"messages": []}
    with recording_turns() as recorder:
        await client.post(URL, json={"messages": []})
        await client.post("http://tg.invalid/v1/rollout/completed", json={})  # not a chat
    assert recorder.turns == []
    assert "return_token_ids" not in json.loads(seen[2].content)


@pytest.mark.parametrize("stream", [True, False])
async def test_the_openai_client_against_the_mock_traingate(
    mock_trainer: tuple[str, Any], stream: bool
) -> None:
    """The mock answers as vLLM does when asked; the turn is what it sent."""
    url, gate = mock_trainer
    ctx = RolloutContext(chat_completions_url=f"{url}/v1/rollouts/r1", rollout_id="r1")
    messages: Any = [
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "tool", "content": "42"},
    ]
    with recording_turns() as recorder:
        client = rollout_client(ctx, sample_id="solver")
        if stream:
            chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        else:
            answer = await client.chat.completions.create(model="m", messages=messages)
            text = answer.choices[0].message.content or ""
    assert text == "#### 42"
    (call,) = gate.calls
    (turn,) = recorder.turns
    assert call.answer is not None
    assert len(call.answer["token_ids"]) == len(text)
    assert turn["token_ids"] == call.answer["token_ids"]
    assert turn["logprobs"] == call.answer["logprobs"]
    assert turn["prompt_token_ids"] == call.answer["prompt_token_ids"]
    assert (turn["sample_id"], turn["finish_reason"]) == ("solver", "stop")
