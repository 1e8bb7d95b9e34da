"""What a hostile answer must not leave behind, each checked from outside the fleet: the
workers' memory (RSS of their process trees, sampled every 0.1 s), the size of every Redis
value, and a secret in views, Redis, logs, metrics and traces. Every check returns what it
found (empty: clean), so one case reports all it saw."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import ThreadingHTTPServer
from typing import cast

import httpx
import psutil
import redis

from rollout_sdk.testing.otlp import serve_otlp

MiB = 2**20


def tree_rss(pids: list[int]) -> int:
    """The resident memory of these processes and all their descendants, in bytes."""
    total = 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for member in members:
            with contextlib.suppress(psutil.Error):
                total += member.memory_info().rss
    return total


class RssWatch:
    """Samples the RSS of ``pids()``'s process trees every ``every`` seconds while inside;
    ``peak`` is the largest total seen. Over ``guard`` bytes it SIGKILLs those trees (they
    are the test's own fleet's workers) so a runaway case cannot take the machine."""

    def __init__(self, pids: Callable[[], list[int]], *, guard: int, every: float = 0.1) -> None:
        self._pids = pids
        self.guard = guard
        self.every = every
        self.peak = 0
        self.guard_tripped_at: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="rss-watch")

    def idle(self, seconds: float = 1.0) -> int:
        """The largest total over ``seconds`` of sampling, before anything runs."""
        seen = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            seen = max(seen, tree_rss(self._pids()))
            time.sleep(self.every)
        return seen

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(self.every):
            pids = self._pids()
            total = tree_rss(pids)
            self.peak = max(self.peak, total)
            if total > self.guard and self.guard_tripped_at is None:
                self.guard_tripped_at = total
                for pid in pids:
                    with contextlib.suppress(psutil.Error, ProcessLookupError):
                        for child in psutil.Process(pid).children(recursive=True):
                            os.kill(child.pid, signal.SIGKILL)
                        os.kill(pid, signal.SIGKILL)


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _members(store: redis.Redis, key: bytes, kind: str) -> Iterator[tuple[str, bytes]]:
    """A key's values by its type: (field or index, value)."""
    if kind == "string":
        yield "", _bytes(store.get(key))
    elif kind == "hash":
        for field, value in store.hscan_iter(key):
            yield _bytes(field).decode(errors="replace"), _bytes(value)
    elif kind == "list":
        for index, value in enumerate(cast(list[bytes], store.lrange(key, 0, -1))):
            yield str(index), _bytes(value)
    elif kind in {"set", "zset"}:
        members = store.sscan_iter(key) if kind == "set" else (m for m, _ in store.zscan_iter(key))
        for value in members:
            yield "member", _bytes(value)
    elif kind == "stream":
        for entry_id, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], store.xrange(key)):
            for field, value in fields.items():
                yield f"{entry_id.decode()}.{field.decode()}", _bytes(value)


def redis_values(store: redis.Redis) -> Iterator[tuple[str, bytes]]:
    """Every value of the database (a ``decode_responses=False`` client), named
    ``key`` or ``key[field]``: strings, hash fields, list, set and sorted-set members,
    stream entries' fields."""
    for raw_key in store.scan_iter(count=1000):
        key = _bytes(raw_key)
        name = key.decode(errors="replace")
        for member, value in _members(store, key, _bytes(store.type(key)).decode()):
            yield (f"{name}[{member}]" if member else name), value


def oversize_values(store: redis.Redis, limit: int) -> list[str]:
    """Keys whose memory (``MEMORY USAGE``) or any one value is over ``limit`` bytes."""
    found = []
    for raw_key in store.scan_iter(count=1000):
        usage = store.memory_usage(raw_key, samples=0) or 0
        if usage > limit:
            found.append(f"{_bytes(raw_key).decode(errors='replace')}: MEMORY USAGE {usage} bytes")
    for name, value in redis_values(store):
        if len(value) > limit:
            found.append(f"{name}: {len(value)} bytes")
    return found


def leaks(secret: str, places: Mapping[str, str | bytes]) -> list[str]:
    """The places (name → text) that hold ``secret``, each with a little context."""
    needle = secret.encode()
    found = []
    for name, text in places.items():
        data = text.encode(errors="replace") if isinstance(text, str) else text
        at = data.find(needle)
        if at >= 0:
            context = data[max(0, at - 120) : at + len(needle) + 40]
            found.append(f"{name}: …{context.decode(errors='replace')}…")
    return found


def redis_bytes(store: redis.Redis) -> bytes:
    """Every key name and value of the database, in one buffer."""
    return b"\n".join(name.encode() + b" " + value for name, value in redis_values(store))


def metrics_text(urls: list[str]) -> str:
    """The ``/metrics`` pages at ``urls``, one after the other (an unreachable one says so)."""
    pages = []
    for url in urls:
        try:
            pages.append(httpx.get(url, timeout=10).text)
        except httpx.HTTPError as exc:
            pages.append(f"{url} unreachable: {exc!r}")
    return "\n".join(pages)


class TraceSink:
    """An OTLP/HTTP trace endpoint keeping every export's raw (gunzipped) protobuf: a
    secret in any span's name, attribute or event is in those bytes as they are."""

    def __init__(self) -> None:
        self._bodies: list[bytes] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer = serve_otlp("/v1/traces", self._take)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, body: bytes) -> bytes:
        with self._lock:
            self._bodies.append(body)
        return b""  # an empty ExportTraceServiceResponse

    def received(self) -> bytes:
        with self._lock:
            return b"\n".join(self._bodies)

    @property
    def exports(self) -> int:
        with self._lock:
            return len(self._bodies)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data)
