"""The hostile-answer matrix's checks can fail: each catches a fault planted by hand (a secret
in a worker's log, a Redis key, a view, a metric page or a trace export; a Redis value over
16 MiB; a process over 600 MiB RSS), and the hostile endpoint answers what it claims."""

from __future__ import annotations

import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import httpx
import pytest
import redis

from rollout_fleet.redis_server import RedisServer
from tests.security.hostile_endpoint import (
    BOMB_DECODED_BYTES,
    GZIP_JSON_BYTES,
    PLAIN_ANSWER_BYTES,
    HostileEndpoint,
    Mode,
)
from tests.security.leak_checks import (
    MiB,
    RssWatch,
    TraceSink,
    gzipped,
    leaks,
    metrics_text,
    oversize_values,
    redis_bytes,
)

SECRET = "planted-secret-0c4f2a"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[HostileEndpoint]:
    server = HostileEndpoint(SECRET)
    yield server
    server.close()


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url_for(1000))
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_the_redis_checks_catch_a_planted_value(store: redis.Redis) -> None:
    store.set("small", b"clean")
    store.hset("record", mapping={"status": "failure", "error": "fine"})
    assert oversize_values(store, 16 * MiB) == []
    assert leaks(SECRET, {"redis": redis_bytes(store)}) == []
    store.hset("record", "result", b"x" * (16 * MiB + 1))
    store.rpush("queue", f"pw={SECRET}")
    found = oversize_values(store, 16 * MiB)
    assert any(line.startswith("record[result]: ") for line in found), found
    assert any("MEMORY USAGE" in line for line in found), found
    (leak,) = leaks(SECRET, {"redis": redis_bytes(store)})
    assert leak.startswith("redis: ")
    assert SECRET in leak


def test_the_leak_check_catches_a_secret_in_a_log_and_a_view() -> None:
    assert leaks(SECRET, {"logs": "a clean line\n", "views": b"{}"}) == []
    found = leaks(SECRET, {"logs": f"WARNING boom pw={SECRET}\n", "views": b"{}"})
    assert [line.split(":")[0] for line in found] == ["logs"]


def test_the_metric_check_reads_the_pages_it_is_given() -> None:
    page = f'rollout_fleet_errors_total{{reason="pw={SECRET}"}} 1\n'.encode()

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        assert leaks(SECRET, {"metrics": metrics_text([url])})
    finally:
        server.shutdown()
        server.server_close()


def test_the_trace_check_catches_a_secret_in_an_export() -> None:
    sink = TraceSink()
    try:
        assert sink.exports == 0
        assert leaks(SECRET, {"traces": sink.received()}) == []
        # A span event's exception.message, as the protobuf carries it: the string as is.
        body = b"\x0a\x11exception.message\x12\x1e" + f"pw={SECRET}".encode()
        answer = httpx.post(
            f"{sink.url}/v1/traces",
            content=gzipped(body),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/x-protobuf"},
        )
        assert answer.status_code == 200
        assert sink.exports == 1
        assert leaks(SECRET, {"traces": sink.received()})
    finally:
        sink.close()


def test_the_rss_watch_sees_a_process_over_600_mib_and_its_guard_kills_it() -> None:
    grow = "b = b'x' * (700 * 2**20); import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", grow])
    try:
        watch = RssWatch(lambda: [child.pid], guard=650 * MiB)
        with watch:
            child.wait(20)
        assert watch.peak > 600 * MiB
        assert watch.guard_tripped_at is not None
        assert child.returncode == -9
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_endpoint_answers_what_it_claims(endpoint: HostileEndpoint) -> None:
    with httpx.Client(timeout=30) as client:
        normal = endpoint.server_url(Mode.NORMAL)
        answer = client.post(f"{normal}/v1/chat/completions", json={"rollout_id": "r-1"})
        assert answer.json()["choices"][0]["message"]["role"] == "assistant"
        assert client.post(f"{normal}/v1/rollout/completed", json={"rollout_id": "r-1"}).is_success
        assert (endpoint.count("r-1", "chat"), endpoint.count("r-1", "callback")) == (1, 1)
        v2 = f"{endpoint.chat_url(Mode.NORMAL)}/chat/completions"
        client.post(v2, json={"stream": True}, headers={"x-rollout-id": "r-2"}).raise_for_status()
        assert endpoint.count("r-2", "chat") == 1

        bomb = f"{endpoint.server_url(Mode.GZIP_BOMB)}/v1/chat/completions"
        with client.stream("POST", bomb, json={}) as streamed:
            assert streamed.headers["content-encoding"] == "gzip"
            unpacker = zlib.decompressobj(zlib.MAX_WBITS | 16)
            decoded = sum(len(unpacker.decompress(chunk)) for chunk in streamed.iter_raw())
        assert decoded >= BOMB_DECODED_BYTES
        assert streamed.num_bytes_downloaded < 8 * MiB

        plain = f"{endpoint.server_url(Mode.PLAIN_200MB)}/v1/chat/completions"
        with client.stream("POST", plain, json={}) as streamed:
            assert sum(len(chunk) for chunk in streamed.iter_raw()) > PLAIN_ANSWER_BYTES

        packed = f"{endpoint.server_url(Mode.GZIP_JSON_100MB)}/v1/chat/completions"
        answer = client.post(packed, json={})
        content = answer.json()["choices"][0]["message"]["content"]
        assert len(content) > GZIP_JSON_BYTES
        assert answer.num_bytes_downloaded < 8 * MiB

        for mode, said in ((Mode.BANNER, "illegal status line"), (Mode.BAD_HEADER, "header")):
            with pytest.raises(httpx.RemoteProtocolError, match=said) as raised:
                client.post(f"{endpoint.server_url(mode)}/v1/chat/completions", json={})
            assert SECRET in str(raised.value)

        trickle = f"{endpoint.server_url(Mode.TRICKLE)}/v1/chat/completions"
        started = time.monotonic()
        with client.stream("POST", trickle, json={}) as streamed:
            received = b""
            for chunk in streamed.iter_raw():
                received += chunk
                if len(received) >= 3:
                    break
        assert time.monotonic() - started >= 1.5  # three bytes took two pauses at least
