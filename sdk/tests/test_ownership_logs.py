"""Upstream's rollout ownership logs from the in-process server: with
``OSMOSIS_ROLLOUT_OTLP_ENDPOINT`` set, each status change of a rollout arrives, in order, as
an OTLP log record at ``<endpoint>/v1/logs`` (a real receiver in the test), naming the
rollout, its status and its owner, and never a key."""

from __future__ import annotations

import asyncio
import http.server
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import httpx
import pytest
from v2_client import admit, final

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    SampleSource,
    create_rollout_server,
    get_rollout_context,
)
from rollout_sdk.server.ownership import OwnershipLog
from rollout_sdk.testing.otlp import OtlpLogReceiver
from rollout_sdk.types import RolloutSample, RolloutStatus

Serve = Callable[[Any], str]
LLM_KEY = "sk-llm-key-that-must-not-travel"
METADATA_KEY = "sk-metadata-key-that-must-not-travel"
PROMPT = "prompt-text-that-stays-home"


class Answered(SampleSource):
    async def get_sample(self, *args: Any) -> RolloutSample:
        return RolloutSample(messages=[{"role": "assistant", "content": "done"}])


class Answer(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        get_rollout_context().set_sample_source(Answered())
        if ctx.metadata.get("sleep"):
            await asyncio.sleep(ctx.metadata["sleep"])


class Full(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpLogReceiver]:
    with OtlpLogReceiver() as otlp:
        monkeypatch.setenv("OSMOSIS_ROLLOUT_OTLP_ENDPOINT", otlp.url + "/")
        monkeypatch.setenv("OSMOSIS_ROLLOUT_SERVER_ID", "srv-1")
        monkeypatch.setenv("_OSMOSIS_ROLLOUT_NAME", "calc-server")
        monkeypatch.setenv("OSMOSIS_ROLLOUT_NAMESPACE", "team-a")
        yield otlp


def statuses(otlp: OtlpLogReceiver, rollout_id: str) -> list[str]:
    logs = otlp.where(rollout_id=rollout_id)
    return [log.attributes["status"] for log in sorted(logs, key=_sequence)]


def _sequence(log: Any) -> int:
    sequence: int = log.attributes["event_sequence"]
    return sequence


def test_each_status_change_is_one_ownership_log_in_order(
    serve: Serve, receiver: OtlpLogReceiver
) -> None:
    url = serve(
        create_rollout_server(
            backend=LocalBackend(workflow=Answer, grader=Full), configure_logging=False
        )
    )
    run = {"run_id": "run-7", "run_name": "nightly", "api_key": METADATA_KEY}
    token = admit(url, "own-1", prompt=PROMPT, llm_api_key=LLM_KEY, osmosis_observability=run)
    assert final(url, "own-1", token)["status"] == "success"
    receiver.wait_for(lambda otlp: "success" in statuses(otlp, "own-1"))

    assert statuses(receiver, "own-1") == ["queued", "running", "grading", "success"]
    logs = sorted(receiver.where(rollout_id="own-1"), key=_sequence)
    assert [_sequence(log) for log in logs] == sorted({_sequence(log) for log in logs})
    for log in logs:
        assert log.service == "osmosis-rollout-server"
        assert log.body == "Rollout ownership"
        assert log.severity_text == "INFO"
        assert {
            k: v for k, v in log.attributes.items() if k not in ("status", "event_sequence")
        } == {
            "event": "rollout.ownership",
            "rollout_id": "own-1",
            "server_id": "srv-1",
            "server_name": "calc-server",
            "namespace": "team-a",
            "run_id": "run-7",
            "run_name": "nightly",
        }
    wire = b"".join(receiver.bodies)
    assert LLM_KEY.encode() not in wire
    assert METADATA_KEY.encode() not in wire
    assert PROMPT.encode() not in wire


def test_a_cancelled_rollout_ends_with_its_cancelled_status(
    serve: Serve, receiver: OtlpLogReceiver
) -> None:
    url = serve(
        create_rollout_server(backend=LocalBackend(workflow=Answer), configure_logging=False)
    )
    token = admit(url, "own-2", sleep=30, osmosis_observability={"run_id": "bad\nid"})
    receiver.wait_for(lambda otlp: "running" in statuses(otlp, "own-2"))
    cancelled = httpx.post(f"{url}/rollout/cancel", json={"ids": ["own-2"]})
    assert cancelled.json()["dispositions"] == {"own-2": "cancelled_running"}
    assert final(url, "own-2", token)["status"] == "cancelled"
    receiver.wait_for(lambda otlp: "cancelled" in statuses(otlp, "own-2"))
    assert statuses(receiver, "own-2") == ["queued", "running", "cancelled"]
    # A run id that is not a printable identifier is left out, not clipped.
    assert all("run_id" not in log.attributes for log in receiver.where(rollout_id="own-2"))


def test_without_the_exporter_installed_one_warning_and_the_server_runs(
    serve: Serve,
    receiver: OtlpLogReceiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An entry of None in sys.modules makes the import fail as if the package were absent.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http._log_exporter", None)
    caplog.set_level(logging.WARNING, logger="rollout_sdk.server.ownership")
    backend = LocalBackend(workflow=Answer, grader=Full)
    url = serve(create_rollout_server(backend=backend, configure_logging=False))
    assert final(url, "own-3", admit(url, "own-3"))["status"] == "success"
    lines = [r.getMessage() for r in caplog.records if r.name == "rollout_sdk.server.ownership"]
    assert lines == [
        "OSMOSIS_ROLLOUT_OTLP_ENDPOINT is set but the OpenTelemetry exporter is not installed; "
        "rollout ownership logs are off (pip install 'rollout-sdk[otlp]')"
    ]
    time.sleep(1.5)  # one export interval: nothing may arrive
    assert receiver.logs == []


def test_without_the_endpoint_nothing_is_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OSMOSIS_ROLLOUT_OTLP_ENDPOINT", raising=False)
    log = OwnershipLog({"server_id": "s"})
    log.start()
    assert not log.enabled
    log.record(log.fields("r", None), RolloutStatus.RUNNING)
    log.close()


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An OTLP endpoint that notes each request's headers and refuses it with words of its
    own."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(400, "FOREIGN-REASON-PHRASE")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        return


def test_a_tracing_vendors_credentials_and_the_endpoints_words_stay_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The OTEL_* headers an operator sets for their tracing vendor are not sent to the
    ownership-log endpoint, and what that endpoint answers is not written to the log."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OSMOSIS_ROLLOUT_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer VENDOR-SECRET")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-api-key=VENDOR-SECRET")
    _Refusing.seen = []
    try:
        with caplog.at_level(logging.DEBUG):
            log = OwnershipLog({"server_id": "srv-1"})
            log.start()
            assert log.enabled
            log.record(log.fields("r-1", None), RolloutStatus.RUNNING)
            log.close()  # flushes the batch
        assert _Refusing.seen, "nothing was exported"
        for headers in _Refusing.seen:
            assert "authorization" not in headers
            assert "x-api-key" not in headers
        assert "VENDOR-SECRET" not in repr(_Refusing.seen)
        failures = [r.getMessage() for r in caplog.records if "Failed to export" in r.getMessage()]
        assert failures, "the refusal was not logged at all"
        assert "FOREIGN-REASON-PHRASE" not in caplog.text
        assert "400" in failures[0]
        assert os.environ["OTEL_EXPORTER_OTLP_HEADERS"].endswith("VENDOR-SECRET")  # put back
    finally:
        server.shutdown()
        server.server_close()
