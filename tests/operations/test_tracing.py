"""With tracing on, one rollout yields one trace holding the gateway's
admission span, the worker's execution span (``rollout.execute``) and the spans of
its TrainGate calls. The fleet's real processes export over OTLP/HTTP to a receiver in this
test, which keeps the spans in memory (the in-memory exporter of a multi-process fleet)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from rollout_sdk.testing.otlp import serve_otlp
from tests.conftest import StartFleet
from tests.harness import CALCULATOR_AGENT, calculator_bodies, new_id, script


@dataclass(frozen=True)
class Span:
    trace_id: str
    name: str
    service: str
    attributes: dict[str, Any]


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value") or "string_value")


def url_of(span: Span) -> Any:
    """The URL of an httpx client span (new or old semantic conventions)."""
    return span.attributes.get("url.full") or span.attributes.get("http.url", "")


@dataclass
class Receiver:
    """An OTLP/HTTP trace endpoint (``POST /v1/traces``, protobuf, maybe gzipped)."""

    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, body: bytes) -> bytes:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append(
                            Span(
                                trace_id=span.trace_id.hex(),
                                name=span.name,
                                service=resource.get("service.name", ""),
                                attributes={a.key: _value(a.value) for a in span.attributes},
                            )
                        )
        answer: bytes = ExportTraceServiceResponse().SerializeToString()
        return answer

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        server = serve_otlp("/v1/traces", self.take)
        return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    spans = Receiver()
    server, url = spans.serve()
    yield spans, url
    server.shutdown()


def test_one_rollout_is_one_trace_from_gateway_to_traingate(
    start_fleet: StartFleet, receiver: tuple[Receiver, str]
) -> None:
    spans, endpoint = receiver
    handle = start_fleet(
        CALCULATOR_AGENT,
        workers=1,
        env={
            "ROLLOUT_FLEET_TRACING": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    try:
        body = calculator_bodies(handle.trainer.url, 2)[1]
        rollout_id = body["rollout_id"]
        assert handle.init(body).status_code == 202
        handle.wait_delivered([rollout_id])
        handle.wait_status(rollout_id, {"success"})
        calls = handle.trainer.calls(rollout_id=rollout_id)

        def wanted() -> dict[str, list[Span]]:
            with spans.lock:
                seen = list(spans.spans)
            return {
                "admission": [
                    s
                    for s in seen
                    if s.service == "rollout-gateway" and s.name == "POST /v1/rollout/init"
                ],
                "execution": [s for s in seen if s.attributes.get("rollout.id") == rollout_id],
                "traingate": [
                    s
                    for s in seen
                    if s.service == "rollout-worker"
                    and s.name == "POST"
                    and str(url_of(s)).startswith(handle.trainer.url)
                ],
            }

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            all(wanted().values()) and len(wanted()["traingate"]) == len(calls)
        ):
            time.sleep(0.2)
        found = wanted()
        assert all(found.values()), {kind: len(s) for kind, s in found.items()}
        assert len(found["traingate"]) == len(calls)  # every chat call and the callback
        assert len(found["admission"]) == len(found["execution"]) == 1
        traces = {span.trace_id for kind in found.values() for span in kind}
        assert len(traces) == 1, found
        (trace_id,) = traces
        # the TrainGate saw the same trace (W3C traceparent on every call)
        assert {call["headers"]["traceparent"].split("-")[1] for call in calls} == {trace_id}
        assert {s.service for s in spans.spans if s.trace_id == trace_id} == {
            "rollout-gateway",
            "rollout-worker",
        }
    finally:
        handle.close()


SECRET = "pw=trace-7d2f0a"


class _Banner:
    """A service that answers any request with an SSH banner quoting a secret."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(5)
                with contextlib.suppress(OSError):
                    connection.recv(65536)
                    connection.sendall(f"SSH-2.0-OpenSSH_9.6 {SECRET}\r\nBye.\r\n\r\n".encode())

    def close(self) -> None:
        self.socket.close()


def test_a_span_never_carries_a_foreign_services_bytes(start_fleet: StartFleet) -> None:
    """A TrainGate call to a service that answers an SSH banner fails with httpx's
    ``RemoteProtocolError``, whose text quotes the banner: the exported spans record the
    exception by its type, and no span carries the banner's bytes."""
    bodies: list[bytes] = []

    def take(body: bytes) -> bytes:
        bodies.append(body)
        answer: bytes = ExportTraceServiceResponse().SerializeToString()
        return answer

    server = serve_otlp("/v1/traces", take)
    banner = _Banner()
    handle = start_fleet(
        workers=1,
        env={
            "ROLLOUT_FLEET_TRACING": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": "0",
            "OSMOSIS_ROLLOUT_CLIENT_COMPLETE_ROLLOUT_RETRIES": "0",
        },
    )
    try:
        rollout_id = new_id("banner")
        body = handle.body(rollout_id, server_url=banner.url, metadata=script({"chat": {}}))
        assert handle.init(body).status_code == 202
        record = handle.wait_status(rollout_id, {"failure"}, timeout=30)
        assert SECRET not in str(record)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            b"RemoteProtocolError" in body for body in list(bodies)
        ):
            time.sleep(0.2)
        exported = b"".join(bodies)
        assert b"RemoteProtocolError" in exported  # the failed call is traced, by its type
        assert SECRET.encode() not in exported
    finally:
        handle.close()
        banner.close()
        server.shutdown()
