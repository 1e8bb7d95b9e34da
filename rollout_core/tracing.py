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

EXECUTION_SPAN = "rollout.execute"

_enabled = False


def setup(service_name: str, app: Any | None = None) -> None:
    """Export spans and instrument this process: a gateway passes its FastAPI ``app``, a
    worker nothing (its execution spans are made by :func:`execution`)."""
    global _enabled  # noqa: PLW0603 - one tracer provider per process
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()
    RedisInstrumentor().instrument()
    if app is not None:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app)
    _enabled = True


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
