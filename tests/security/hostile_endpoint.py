"""A trainer-chosen endpoint that answers what no trainer should: a real server on a free
loopback port (asyncio raw sockets on a thread of its own), started and stopped by a test.

The URL picks the behaviour: ``{url}/{chat_mode}/{callback_mode}`` is a v1 ``server_url``
(``.../v1/chat/completions`` gets ``chat_mode``, ``.../v1/rollout/completed`` gets
``callback_mode``), ``{url}/{chat_mode}/{callback_mode}/v1`` a v2 ``chat_completions_url``.
Every hostile answer quotes ``secret``; ``normal`` answers an OpenAI-shaped chat completion
(SSE if the request asks to stream) and takes a callback with 200.

Requests are counted per rollout (the JSON body's ``rollout_id``, else the
``x-rollout-id`` header) and role (``chat`` or ``callback``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import zlib
from collections import Counter
from enum import StrEnum
from typing import Any

MiB = 2**20
GiB = 2**30

BOMB_DECODED_BYTES = GiB  # the gzip bomb's decoded size
PLAIN_ANSWER_BYTES = 200 * MiB  # the plain answer's content
GZIP_JSON_BYTES = 100 * MiB  # the gzipped valid completion's content
TRICKLE_EVERY_SECONDS = 1.0


class Mode(StrEnum):
    NORMAL = "normal"
    GZIP_BOMB = "gzip_bomb"  # ≥ 1 GiB of zeros behind a few MB of gzip
    PLAIN_200MB = "plain_200mb"  # a valid completion whose content is 200 MiB, streamed
    GZIP_JSON_100MB = "gzip_json_100mb"  # a valid completion of 100 MiB, gzipped
    TRICKLE = "trickle"  # a valid completion, one byte a second
    BANNER = "banner"  # not HTTP: an SSH banner quoting the secret, then close
    BAD_HEADER = "bad_header"  # a header line without a colon quoting the secret, then close


HOSTILE = [mode for mode in Mode if mode is not Mode.NORMAL]
OVERSIZE = {Mode.GZIP_BOMB, Mode.PLAIN_200MB, Mode.GZIP_JSON_100MB}


def completion(content: str, rollout_id: str = "hostile") -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{rollout_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "osmosis-rollout",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def _gzip(parts: list[tuple[bytes, int]]) -> bytes:
    """The gzip stream of each (block, times) in turn, built without the whole text."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    out = [packer.compress(block) for block, times in parts for _ in range(times)]
    return b"".join([*out, packer.flush()])


def _large_completion(secret: str) -> tuple[bytes, bytes]:
    """A chat completion whose content quotes ``secret`` then a filler: the JSON before the
    filler and after it."""
    marker = "\x00FILL\x00"
    text = json.dumps(completion(f"pw={secret} {marker}")).encode()
    head, tail = text.split(json.dumps(marker)[1:-1].encode())
    return head, tail


class HostileEndpoint:
    """Start it, use :meth:`server_url` / :meth:`chat_url`, :meth:`close` it."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        block = b"\0" * MiB
        head, tail = _large_completion(secret)
        self._plain = (head, tail)
        self._bomb = _gzip([(f"pw={secret} ".encode(), 1), (block, BOMB_DECODED_BYTES // MiB)])
        self._gzip_json = _gzip([(head, 1), (b"a" * MiB, GZIP_JSON_BYTES // MiB), (tail, 1)])
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hostile-endpoint")
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the hostile endpoint did not start")
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        self.url: str = f"http://127.0.0.1:{port}"

    @property
    def bomb_wire_bytes(self) -> int:
        return len(self._bomb)

    def server_url(self, chat: Mode, callback: Mode = Mode.NORMAL) -> str:
        """A v1 ``server_url``."""
        return f"{self.url}/{chat}/{callback}"

    def chat_url(self, chat: Mode) -> str:
        """A v2 ``chat_completions_url``."""
        return f"{self.url}/{chat}/{Mode.NORMAL}/v1"

    def count(self, rollout_id: str, role: str) -> int:
        with self._lock:
            return self._counts[(rollout_id, role)]

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self._started.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,  # closed
        ):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open for another."""
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines if line)
        }
        body = await _read_body(reader, headers)
        path = request_line.split(" ")[1]
        parts = path.strip("/").split("/")
        try:
            chat_mode, callback_mode = Mode(parts[0]), Mode(parts[1])
        except (IndexError, ValueError):
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return True
        role = "callback" if path.endswith("/rollout/completed") else "chat"
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            payload = {}
        rollout_id = (
            payload.get("rollout_id") if isinstance(payload, dict) else None
        ) or headers.get("x-rollout-id", "")
        with self._lock:
            self._counts[(str(rollout_id), role)] += 1
        mode = callback_mode if role == "callback" else chat_mode
        if mode is Mode.NORMAL:
            await self._normal(writer, role, payload, str(rollout_id))
            return True
        await self._hostile(writer, mode)
        return False

    async def _normal(
        self, writer: asyncio.StreamWriter, role: str, payload: Any, rollout_id: str
    ) -> None:
        if role == "callback":
            _respond(writer, b'{"status":"ok"}')
        elif isinstance(payload, dict) and payload.get("stream"):
            answer = completion("The answer is 42. #### 42", rollout_id)
            chunk = {
                "id": answer["id"],
                "object": "chat.completion.chunk",
                "created": answer["created"],
                "model": answer["model"],
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": "The answer is 42. #### 42"},
                        "finish_reason": None,
                    }
                ],
            }
            end = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            usage = {**chunk, "choices": [], "usage": answer["usage"]}
            events = b"".join(
                f"data: {json.dumps(event)}\n\n".encode() for event in (chunk, end, usage)
            )
            _respond(writer, events + b"data: [DONE]\n\n", "text/event-stream")
        else:
            _respond(
                writer, json.dumps(completion("The answer is 42. #### 42", rollout_id)).encode()
            )
        await writer.drain()

    async def _hostile(self, writer: asyncio.StreamWriter, mode: Mode) -> None:
        secret = self.secret
        if mode is Mode.BANNER:
            # a blank line after it: the client's HTTP parser reads it as a status line
            writer.write(f"SSH-2.0-OpenSSH_9.6 pw={secret}\r\n\r\n".encode())
        elif mode is Mode.BAD_HEADER:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"X-Debug pw={secret}\r\n\r\n".encode()
            )
        elif mode is Mode.GZIP_BOMB:
            _respond(writer, self._bomb, encoding="gzip")
        elif mode is Mode.GZIP_JSON_100MB:
            _respond(writer, self._gzip_json, encoding="gzip")
        elif mode is Mode.PLAIN_200MB:
            head, tail = self._plain
            size = len(head) + PLAIN_ANSWER_BYTES + len(tail)
            _respond(writer, head, length=size)
            block = b"a" * MiB
            for _ in range(PLAIN_ANSWER_BYTES // MiB):
                writer.write(block)
                await writer.drain()
            writer.write(tail)
        elif mode is Mode.TRICKLE:
            body = json.dumps(completion(f"pw={secret}")).encode()
            _respond(writer, b"", length=len(body))
            await writer.drain()
            for index in range(len(body)):
                writer.write(body[index : index + 1])
                await writer.drain()
                await asyncio.sleep(TRICKLE_EVERY_SECONDS)
        await writer.drain()


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size + 2))
        await reader.readuntil(b"\r\n")  # no trailers
        return b"".join(chunk[:-2] for chunk in chunks)
    return await reader.readexactly(int(headers.get("content-length") or 0))


def _respond(
    writer: asyncio.StreamWriter,
    body: bytes,
    content_type: str = "application/json",
    *,
    encoding: str | None = None,
    length: int | None = None,
) -> None:
    """A 200's head, then ``body`` (the whole body unless ``length`` says more follows)."""
    head = [
        "HTTP/1.1 200 OK",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body) if length is None else length}",
    ]
    if encoding:
        head.append(f"Content-Encoding: {encoding}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
