"""An OTLP/HTTP log receiver for tests: ``POST /v1/logs`` on a free loopback port.

It decodes what exporters send (protobuf, maybe gzipped) with ``opentelemetry-proto`` and
keeps every log record in memory, with the raw request bodies, so a test can check both the
records and that a secret appears nowhere on the wire. Needs ``rollout-sdk[otlp]``.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

LOGS_PATH = "/v1/logs"


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value") or "string_value")


def serve_otlp(path: str, take: Callable[[bytes], bytes]) -> ThreadingHTTPServer:
    """Serve ``POST path`` on a free loopback port from a daemon thread: each request body
    (gunzipped) goes to ``take``, whose bytes are the protobuf answer. Other paths: 404."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != path:
                self.send_error(404)
                return
            answer = take(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass(frozen=True)
class ReceivedLog:
    """One log record as it arrived: its resource's ``service.name``, body and attributes."""

    service: str
    body: Any
    attributes: dict[str, Any]
    severity_text: str


class OtlpLogReceiver:
    """``with OtlpLogReceiver() as receiver:`` serves until the block ends;
    ``receiver.url`` is the endpoint (without ``/v1/logs``)."""

    def __init__(self) -> None:
        self.logs: list[ReceivedLog] = []
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the receiver is not serving"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, body: bytes) -> bytes:
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        received = [
            ReceivedLog(
                service=str(resource.get("service.name", "")),
                body=_value(record.body),
                attributes={a.key: _value(a.value) for a in record.attributes},
                severity_text=record.severity_text,
            )
            for resource_logs in request.resource_logs
            for resource in [{a.key: _value(a.value) for a in resource_logs.resource.attributes}]
            for scope_logs in resource_logs.scope_logs
            for record in scope_logs.log_records
        ]
        with self._lock:
            self.bodies.append(body)
            self.logs.extend(received)
        answer: bytes = ExportLogsServiceResponse().SerializeToString()
        return answer

    def __enter__(self) -> OtlpLogReceiver:
        self._server = serve_otlp(LOGS_PATH, self._take)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def where(self, **attributes: Any) -> list[ReceivedLog]:
        """The records received so far whose attributes include these, in arrival order."""
        with self._lock:
            logs = list(self.logs)
        return [
            log for log in logs if all(log.attributes.get(k) == v for k, v in attributes.items())
        ]

    def wait_for(
        self, done: Callable[[OtlpLogReceiver], bool], timeout: float = 30
    ) -> list[ReceivedLog]:
        """Wait until ``done(self)``; every record received. ``AssertionError`` on timeout."""
        deadline = time.monotonic() + timeout
        while not done(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"OTLP receiver: condition not met; got {self.logs}")
            time.sleep(0.05)
        with self._lock:
            return list(self.logs)


__all__ = ["LOGS_PATH", "OtlpLogReceiver", "ReceivedLog", "serve_otlp"]
