"""Rollout ownership logs: which server holds which rollout, and its status, as OTLP logs.

Upstream's rollout servers (since 0.3.4) tell the Osmosis platform's dashboard where each
rollout runs by exporting one log record per status change to
``<OSMOSIS_ROLLOUT_OTLP_ENDPOINT>/v1/logs`` (SDK.md §2.13). Our in-process server
(``create_rollout_server``) and the fleet's v2 workers send the same records, so dashboards
built for upstream's servers see ours.

A record names the rollout, its status, the owning server and, if the trainer supplied them
in ``metadata["osmosis_observability"]``, the training run; nothing else of the request (no
prompts, labels or keys). Exporting runs on the OpenTelemetry SDK's background thread and
never changes admission, leases or results: a failure is a warning line. The exporter is the
optional ``rollout-sdk[otlp]`` extra; with the endpoint set and the extra missing, starting
logs one warning line and the server runs without the logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rollout_sdk.types.sample import RolloutStatus

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider

logger = logging.getLogger(__name__)

OTLP_ENDPOINT_ENV = "OSMOSIS_ROLLOUT_OTLP_ENDPOINT"
SERVER_ID_ENV = "OSMOSIS_ROLLOUT_SERVER_ID"
SERVER_NAME_ENV = "_OSMOSIS_ROLLOUT_NAME"
NAMESPACE_ENV = "OSMOSIS_ROLLOUT_NAMESPACE"
INSTANCE_ID_ENV = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
# The request metadata key under which a trainer names its run (``run_id``, ``run_name``).
OBSERVABILITY_METADATA_KEY = "osmosis_observability"
SERVICE_NAME = "osmosis-rollout-server"
EVENT = "rollout.ownership"
BODY = "Rollout ownership"
MAX_FIELD_CHARS = 512
INSTALL_HINT = "pip install 'rollout-sdk[otlp]'"


def _field(value: object) -> str | None:
    """A printable, non-blank string of bounded size, else nothing: attributes are for
    identifiers, and a dashboard groups by them."""
    if isinstance(value, str) and value.strip() and len(value) <= MAX_FIELD_CHARS:
        return value if value.isprintable() else None
    return None


def owner_from_env(default_server_id: str | None = None) -> dict[str, str]:
    """The owning server's identity: ``server_id`` (``OSMOSIS_ROLLOUT_SERVER_ID``, else the
    instance id, else ``default_server_id``, else the host name), ``server_name`` and
    ``namespace`` when set."""
    candidates = {
        "server_id": os.environ.get(SERVER_ID_ENV)
        or os.environ.get(INSTANCE_ID_ENV)
        or default_server_id
        or socket.gethostname(),
        "server_name": os.environ.get(SERVER_NAME_ENV, ""),
        "namespace": os.environ.get(NAMESPACE_ENV, ""),
    }
    return {key: value for key, value in candidates.items() if _field(value) is not None}


Fields = dict[str, str]


# What the OpenTelemetry exporter would add from the environment that belongs to another
# destination: the headers, client certificates and credential providers an operator sets for
# their tracing vendor (OPERATIONS.md) must not travel to the ownership-log endpoint.
_CREDENTIAL_VARIABLES = ("HEADERS", "CLIENT_KEY", "CLIENT_CERTIFICATE", "CREDENTIAL_PROVIDER")


@contextlib.contextmanager
def _without(markers: tuple[str, ...]) -> Iterator[None]:
    """The OTLP exporter variables holding any of ``markers`` taken out of the environment
    while the block runs (the exporter reads them as it is made), then put back."""
    names = [
        name
        for name in os.environ
        if name.startswith(("OTEL_EXPORTER_OTLP_", "OTEL_PYTHON_EXPORTER_OTLP_"))
        and any(marker in name for marker in markers)
    ]
    saved = {name: os.environ.pop(name) for name in names}
    try:
        yield
    finally:
        os.environ.update(saved)


class _NoForeignWords(logging.Filter):
    """The exporter logs a failed export with the endpoint's reason phrase and errors: words
    chosen by the other side. Keep the numbers (status code, delay), hide the text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                arg if isinstance(arg, (int, float)) or arg == "logs" else "(not shown)"
                for arg in record.args
            )
        return True


def _quiet_foreign_words() -> None:
    """Put :class:`_NoForeignWords` on every OpenTelemetry exporter logger made so far (the
    exporter's modules are imported by now)."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("opentelemetry.exporter"):
            exporter_logger = logging.getLogger(name)
            if not any(isinstance(f, _NoForeignWords) for f in exporter_logger.filters):
                exporter_logger.addFilter(_NoForeignWords())


class OwnershipLog:
    """One server's ownership log; a no-op until :meth:`start` finds an endpoint."""

    def __init__(self, owner: Mapping[str, str] | None = None) -> None:
        self.owner = dict(owner_from_env() if owner is None else owner)
        self._provider: LoggerProvider | None = None
        self._logger: Any = None
        self._sequence = 0

    @property
    def enabled(self) -> bool:
        return self._logger is not None

    def start(self) -> None:
        """Export to ``OSMOSIS_ROLLOUT_OTLP_ENDPOINT`` if set (with its own provider, so an
        application's global OpenTelemetry setup is left alone)."""
        endpoint = os.environ.get(OTLP_ENDPOINT_ENV, "").strip().rstrip("/")
        if not endpoint or self._provider is not None:
            return
        try:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
            from opentelemetry.sdk._logs import LoggerProvider
            from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
            from opentelemetry.sdk.resources import Resource
        except ImportError:
            logger.warning(
                "%s is set but the OpenTelemetry exporter is not installed; rollout "
                "ownership logs are off (%s)",
                OTLP_ENDPOINT_ENV,
                INSTALL_HINT,
            )
            return
        with _without(_CREDENTIAL_VARIABLES):
            exporter = OTLPLogExporter(endpoint=f"{endpoint}/v1/logs", timeout=2)
        _quiet_foreign_words()
        provider = LoggerProvider(resource=Resource({"service.name": SERVICE_NAME}))
        provider.add_log_record_processor(
            BatchLogRecordProcessor(
                exporter,
                max_queue_size=1024,
                max_export_batch_size=128,
                schedule_delay_millis=1000,
                export_timeout_millis=3000,
            )
        )
        self._provider = provider
        self._logger = provider.get_logger(__name__)

    def fields(self, rollout_id: str, metadata: Mapping[str, Any] | None) -> Fields | None:
        """The attributes every record of this rollout carries, or ``None`` (no records)
        when the rollout or server id is not a usable identifier: a clipped one could
        merge two owners on the dashboard."""
        if _field(rollout_id) is None or "server_id" not in self.owner:
            return None
        fields = {"event": EVENT, "rollout_id": rollout_id, **self.owner}
        run = (metadata or {}).get(OBSERVABILITY_METADATA_KEY)
        if isinstance(run, Mapping):
            for key in ("run_id", "run_name"):
                value = _field(run.get(key))
                if value is not None:
                    fields[key] = value
        return fields

    def record(self, fields: Fields | None, status: RolloutStatus) -> None:
        """Queue one record; the exporter's thread sends it (never blocks the caller)."""
        if self._logger is None or fields is None:
            return
        self._sequence += 1
        try:
            self._logger.emit(
                timestamp=time.time_ns(),
                severity_text="INFO",
                body=BODY,
                attributes={**fields, "status": status.value, "event_sequence": self._sequence},
            )
        except Exception as exc:
            logger.warning("could not record rollout ownership: %s", type(exc).__name__)

    def close(self) -> None:
        """Send what is queued (up to 3 s) and stop the exporter; blocking, so async
        callers run it in a thread."""
        provider, self._provider, self._logger = self._provider, None, None
        if provider is not None:
            provider.force_flush(timeout_millis=3000)
            provider.shutdown()


__all__ = [
    "OBSERVABILITY_METADATA_KEY",
    "OTLP_ENDPOINT_ENV",
    "SERVICE_NAME",
    "Fields",
    "OwnershipLog",
    "owner_from_env",
]
