"""Optional OpenTelemetry tracing: one trace per rollout, from the gateway's admission through
the worker's execution to each TrainGate call (``ROLLOUT_FLEET_TRACING=true``; needs
``rollout-fleet[tracing]``; off, nothing here is imported).

The standard instrumentations make the spans: FastAPI (the admission request), httpx
(TrainGate calls), redis (every command); the worker adds its execution span
(``rollout.execute``). The admission's trace context is kept in the rollout's record (and
its Celery message), so the execution span joins the admission's trace, on every attempt.
Spans are exported over OTLP/HTTP, configured by the standard ``OTEL_*`` variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ...).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from rollout_core.store.record import RolloutRecord
from rollout_core.store.schema import TRACE_FIELDS, RecordField
from rollout_sdk.core.foreign import is_foreign_type

EXECUTION_SPAN = "rollout.execute"

_enabled = False


def setup(service_name: str, app: Any | None = None) -> None:
    """Export spans and instrument this process: a gateway passes its FastAPI ``app``, a
    worker nothing (its execution spans are made by :func:`execution`)."""
    global _enabled  # noqa: PLW0603 - one tracer provider per process
    from opentelemetry import trace
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(_exporter_showing_no_foreign_bytes()))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()
    RedisInstrumentor().instrument()
    if app is not None:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app)
    _enabled = True


def _exporter_showing_no_foreign_bytes() -> Any:
    """The OTLP exporter, behind one that keeps other services' bytes out of spans
    (``rollout_sdk.core.foreign``): an exception event of a foreign type says its type only,
    a span's error status likewise, and no event carries a stack trace (one quotes every
    exception of its chain; the logs keep tracebacks, told safely)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import Status

    def foreign(qualified: object) -> bool:
        module, _, name = str(qualified).rpartition(".")
        return is_foreign_type(module, name)

    def event(shown: Event) -> Event:
        if shown.name != "exception" or not shown.attributes:
            return shown
        attributes = dict(shown.attributes)
        attributes.pop("exception.stacktrace", None)
        kind = attributes.get("exception.type", "")
        if foreign(kind):
            attributes["exception.message"] = str(kind).rpartition(".")[2]
        return Event(shown.name, attributes, shown.timestamp)

    def status(span: ReadableSpan) -> Status:
        text = span.status.description or ""
        kind, colon, _ = text.partition(": ")
        types = [e.attributes.get("exception.type", "") for e in span.events if e.attributes]
        if colon and any(str(t).rpartition(".")[2] == kind and foreign(t) for t in types):
            return Status(span.status.status_code, kind)
        return span.status

    def shown(span: ReadableSpan) -> ReadableSpan:
        if not any(e.name == "exception" for e in span.events):
            return span
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=span.attributes,
            events=[event(e) for e in span.events],
            links=span.links,
            kind=span.kind,
            status=status(span),
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    class Shown(SpanExporter):
        def __init__(self) -> None:
            self._inner = OTLPSpanExporter()

        def export(self, spans: Any) -> SpanExportResult:
            return self._inner.export([shown(span) for span in spans])

        def shutdown(self) -> None:
            self._inner.shutdown()  # type: ignore[no-untyped-call]

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return self._inner.force_flush(timeout_millis)

    return Shown()


def shutdown() -> None:
    """Flush the spans still buffered (a stopping process)."""
    if _enabled:
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        flush = getattr(provider, "shutdown", None)
        if flush is not None:
            flush()


def context_fields() -> dict[RecordField, str]:
    """The current trace context (W3C headers) as record fields and message headers ({} when
    tracing is off)."""
    if not _enabled:
        return {}
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return {field: carrier[field] for field in TRACE_FIELDS if field in carrier}


@contextlib.contextmanager
def execution(record: RolloutRecord, rollout_id: str) -> Iterator[None]:
    """A worker's execution of a rollout, in the trace its admission started."""
    if not _enabled:
        yield
        return
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    parent = extract(dict(record.trace))
    tracer = trace.get_tracer(__name__)
    attributes = {"rollout.id": rollout_id, "rollout.protocol": record.protocol}
    with tracer.start_as_current_span(EXECUTION_SPAN, context=parent, attributes=attributes):
        yield


__all__ = ["EXECUTION_SPAN", "context_fields", "execution", "setup", "shutdown"]
