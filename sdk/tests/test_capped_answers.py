"""Every answer the SDK's clients read is read against a cap, decoded a step at a time; a chat
answer's message must be the OpenAI shape; an error never quotes what a server sent. Against a
real local server speaking raw HTTP/1.1 (any bytes, any size, any speed)."""

from __future__ import annotations

import asyncio
import functools
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from openai import APIConnectionError

from rollout_sdk.client import OsmosisLLMClient, new_http_client
from rollout_sdk.client.capped import MIB, AnswerRefused, in_flight_budget, reading_answers
from rollout_sdk.config import RolloutSettings
from rollout_sdk.core.answers import (
    MAX_TOOL_CALLS,
    ChatAnswerInvalid,
    check_chunk,
    check_completion,
)
from rollout_sdk.core.exceptions import OsmosisTransportError, OsmosisValidationError
from rollout_sdk.core.foreign import describe, format_exception
from rollout_sdk.integrations.openai_client import TrainGateOpenAI

pytestmark = pytest.mark.anyio

SECRET = "pw=hunter2-7c1e"
Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def completion(content: Any = "hi", role: Any = "assistant") -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": role, "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def head(headers: dict[str, str], status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode()


@functools.cache
def gzip_bomb_chunks(decoded: int) -> list[bytes]:
    """A gzip stream of ``decoded`` zero bytes, compressed as it is made."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(MIB)
    chunks = [packer.compress(block) for _ in range(decoded // MIB)]
    chunks.append(packer.flush())
    return [chunk for chunk in chunks if chunk]


async def send_chunked(
    writer: asyncio.StreamWriter, chunks: list[bytes] | AsyncIterator[bytes]
) -> None:
    async def each() -> AsyncIterator[bytes]:
        if isinstance(chunks, list):
            for chunk in chunks:
                yield chunk
        else:
            async for chunk in chunks:
                yield chunk

    async for chunk in each():
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


class RawServer:
    """Answers every request with ``answer`` (one request per connection)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in request_head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            await self.answer(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def settings(cap_mb: int = 1, in_flight_mb: int = 64) -> RolloutSettings:
    return RolloutSettings.model_validate(
        {
            "client": {
                "max_answer_mb": cap_mb,
                "answers_in_flight_mb": in_flight_mb,
                "max_retries": 0,
                "timeout_seconds": 2,
            }
        }
    )


async def get(url: str, cap_mb: int = 1) -> httpx.Response:
    async with new_http_client(settings(cap_mb)) as client:
        return await client.post(url + "/v1/chat/completions", content=b"{}")


async def ask_v2(url: str, retries: int) -> object:
    """One chat call through the integrations' OpenAI client over the SDK's transport."""
    client = TrainGateOpenAI(
        api_key="k",
        base_url=url + "/v1",
        max_retries=retries,
        http_client=new_http_client(settings()),
    )
    return await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "q"}]
    )


async def gzip_bomb(writer: asyncio.StreamWriter) -> None:
    writer.write(head({"Content-Encoding": "gzip", "Transfer-Encoding": "chunked"}))
    await send_chunked(writer, gzip_bomb_chunks(1024 * MIB))


async def test_a_gzip_bomb_is_refused_at_the_cap_not_expanded() -> None:
    async with RawServer(gzip_bomb) as url:
        with pytest.raises(AnswerRefused) as caught:
            await get(url)
    assert str(caught.value) == (
        f"POST {url}/v1/chat/completions: the answer is over 1 MiB "
        "(OSMOSIS_ROLLOUT_CLIENT_MAX_ANSWER_MB)"
    )


async def test_a_large_plain_answer_is_refused_at_the_cap() -> None:
    async def big(writer: asyncio.StreamWriter) -> None:
        writer.write(head({"Transfer-Encoding": "chunked"}))
        await send_chunked(writer, [b"x" * 65536] * 64)

    async with RawServer(big) as url:
        with pytest.raises(AnswerRefused, match="over 1 MiB"):
            await get(url)


async def test_a_declared_length_over_the_cap_is_refused_before_reading() -> None:
    async def declared(writer: asyncio.StreamWriter) -> None:
        writer.write(head({"Content-Length": str(2 * MIB)}))
        await writer.drain()
        await asyncio.sleep(30)  # never sends it: the refusal must not wait for it

    async with RawServer(declared) as url:
        async with asyncio.timeout(5):
            with pytest.raises(AnswerRefused, match="over 1 MiB"):
                await get(url)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw", "identity"])
async def test_answers_under_the_cap_are_decoded_whatever_their_encoding(encoding: str) -> None:
    body = json.dumps(completion("x" * 300_000)).encode()
    if encoding == "gzip":
        packer = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    elif encoding == "deflate":
        packer = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    elif encoding == "deflate-raw":
        packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    sent = body if encoding == "identity" else packer.compress(body) + packer.flush()
    declared = encoding.removesuffix("-raw")

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(head({"Content-Encoding": declared, "Content-Length": str(len(sent))}) + sent)

    async with RawServer(answer) as url:
        response = await get(url)
    assert response.status_code == 200
    assert response.content == body
    assert response.headers.get("content-encoding", "identity") == "identity"  # decoded here


@pytest.mark.parametrize("declared", ["br", "gzip, gzip", f"x-{SECRET}"])
async def test_an_encoding_not_decoded_here_is_refused_without_quoting_it(declared: str) -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(head({"Content-Encoding": declared, "Content-Length": "2"}) + b"{}")

    async with RawServer(answer) as url:
        with pytest.raises(AnswerRefused) as caught:
            await get(url)
    assert "Content-Encoding is not gzip or deflate" in str(caught.value)
    assert SECRET not in str(caught.value)


async def test_the_in_flight_budget_is_given_back_and_refuses_past_it() -> None:
    budget = in_flight_budget(3 * MIB)

    async def slow_big(writer: asyncio.StreamWriter) -> None:
        writer.write(head({"Transfer-Encoding": "chunked"}))
        await send_chunked(writer, [b"x" * 65536] * 28)  # 1.75 MiB each

    async with RawServer(slow_big) as url, new_http_client(settings(2, 3)) as client:
        results = await asyncio.gather(
            *(client.post(url + "/x", content=b"") for _ in range(2)), return_exceptions=True
        )
        assert budget.held == 0
        ok = [r for r in results if isinstance(r, httpx.Response)]
        refused = [r for r in results if isinstance(r, AnswerRefused)]
        assert len(ok) + len(refused) == 2
        assert all("OSMOSIS_ROLLOUT_CLIENT_ANSWERS_IN_FLIGHT_MB" in str(r) for r in refused)
        again = await client.post(url + "/x", content=b"")  # everything given back
        assert len(again.content) == 28 * 65536
    assert budget.held == 0


async def banner(writer: asyncio.StreamWriter) -> None:
    writer.write(
        f"SSH-2.0-OpenSSH_9.6 {SECRET}\r\nInvalid SSH identification string.\r\n\r\n".encode()
    )


async def malformed_header(writer: asyncio.StreamWriter) -> None:
    writer.write(f"HTTP/1.1 200 OK\r\nX-Bad {SECRET}\r\n\r\n".encode())


@pytest.mark.parametrize("answer", [banner, malformed_header], ids=["banner", "header"])
async def test_a_v1_client_error_never_quotes_the_servers_bytes(answer: Answer) -> None:
    async with (
        RawServer(answer) as url,
        OsmosisLLMClient(url, "r1", settings=settings(), max_retries=1) as client,
    ):
        with pytest.raises(OsmosisTransportError) as caught:
            await client.chat_completions([{"role": "user", "content": "q"}])
    message = str(caught.value)
    assert message == f"POST {url}/v1/chat/completions failed: RemoteProtocolError"
    assert SECRET not in format_exception(caught.value)


@pytest.mark.parametrize(
    ("content", "role", "field"),
    [
        ({"a": SECRET}, "assistant", "choices.0.message.content"),
        ("hi", "system", "choices.0.message.role"),
        ("hi", SECRET, "choices.0.message.role"),
    ],
)
async def test_a_chat_answer_not_of_the_openai_shape_fails_naming_the_field(
    content: Any, role: Any, field: str
) -> None:
    body = json.dumps(completion(content, role)).encode()

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(head({"Content-Length": str(len(body))}) + body)

    async with RawServer(answer) as url:
        async with OsmosisLLMClient(url, "r1", settings=settings()) as v1:
            with pytest.raises(OsmosisValidationError) as v1_error:
                await v1.chat_completions([{"role": "user", "content": "q"}])
        with pytest.raises(ChatAnswerInvalid) as v2_error:
            await ask_v2(url, retries=0)
    leaf = field.rsplit(".", 1)[1]
    assert f"choices.0.message: {leaf}: " in str(v1_error.value)
    assert f"{field}: " in str(v2_error.value)
    for error in (v1_error.value, v2_error.value):
        assert SECRET not in str(error)
        assert SECRET not in describe(error)


async def test_a_v2_client_over_the_cap_is_told_in_the_sdks_words() -> None:
    async with RawServer(gzip_bomb) as url:
        with pytest.raises(APIConnectionError) as caught:
            await ask_v2(url, retries=1)
    assert describe(caught.value) == (
        f"POST {url}/v1/chat/completions: the answer is over 1 MiB "
        "(OSMOSIS_ROLLOUT_CLIENT_MAX_ANSWER_MB)"
    )


async def test_a_rollouts_answers_add_up_to_its_budget_over_every_turn() -> None:
    """Each answer under the per-answer cap, yet a rollout keeps what every turn answered:
    inside ``reading_answers`` the sum is capped too, and the call past it fails naming the
    setting; outside it (another rollout) the same answers are read."""
    body = json.dumps(completion("x" * 400_000)).encode()

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(head({"Content-Length": str(len(body))}) + body)

    async with (
        RawServer(answer) as url,
        OsmosisLLMClient(url, "r1", settings=settings()) as client,
    ):
        with reading_answers(1) as answers:
            await client.chat_completions([{"role": "user", "content": "q"}])
            await client.chat_completions([{"role": "user", "content": "q"}])
            with pytest.raises(OsmosisValidationError) as caught:
                await client.chat_completions([{"role": "user", "content": "q"}])
        assert answers.read > MIB
        assert "this rollout's answers add up to over 1 MiB" in str(caught.value)
        assert "(OSMOSIS_ROLLOUT_CLIENT_MAX_ROLLOUT_ANSWERS_MB)" in str(caught.value)
        with reading_answers(1):  # a new rollout starts from nothing
            await client.chat_completions([{"role": "user", "content": "q"}])


def test_an_answer_holds_at_most_128_tool_calls_whole_or_streamed() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    whole = completion()
    whole["choices"][0]["message"]["tool_calls"] = [call] * MAX_TOOL_CALLS
    check_completion(whole)
    whole["choices"][0]["message"]["tool_calls"] = [call] * (MAX_TOOL_CALLS + 1)
    with pytest.raises(ChatAnswerInvalid, match=r"choices\.0\.message\.tool_calls: "):
        check_completion(whole)

    def chunk(index: int) -> dict[str, Any]:
        delta = {"tool_calls": [{"index": index, "function": {"arguments": "{}"}}]}
        return {"choices": [{"index": 0, "delta": delta}]}

    check_chunk(chunk(MAX_TOOL_CALLS - 1))
    for index in (MAX_TOOL_CALLS, -1):
        with pytest.raises(ChatAnswerInvalid, match=r"choices\.0\.delta\.tool_calls\.0\.index"):
            check_chunk(chunk(index))
