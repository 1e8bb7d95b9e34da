"""A trainer-chosen endpoint that answers with a gzip bomb, a 200 MB body, a 100 MB gzipped
completion, a body trickled a byte a second, an SSH banner or a malformed header (the last two
quoting a secret) fails the rollouts it serves, once each and in bounded time, and nothing
else: a worker stays under 600 MiB, no Redis value grows past 16 MiB, normal rollouts beside
them succeed, and the secret reaches no view, Redis value, log line, metric or trace.

Each case (hostile mode × v1 chat, v2 chat, v1 callback) runs a fleet of its own (gateway, one
worker at the product's default concurrency, real redis-server, tracing on, and a supervisor
that starts a worker again when it ends, as compose's restart policy does) against
:class:`HostileEndpoint`. v1 runs the scripted agent (one chat, complete); v2 runs
``tests/agents/id_headers_v2.py``'s OpenAI-client path (the OpenAI client over the SDK's
httpx transport). Over-size answers must fail naming ``OSMOSIS_ROLLOUT_CLIENT_MAX_ANSWER_MB``.
A case gathers every problem it sees and reports them together; each writes what it measured
to ``test-output/hostile-matrix/<case>.json``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from tests.conftest import V2_ENV, StartFleet
from tests.harness import (
    REPO,
    SCRIPTED_AGENT,
    TERMINAL,
    FleetUnderTest,
    V2FleetUnderTest,
    all_logs,
    new_id,
    redis_dump,
    supervised,
)
from tests.security.hostile_endpoint import HOSTILE, OVERSIZE, HostileEndpoint, Mode
from tests.security.leak_checks import (
    MiB,
    RssWatch,
    TraceSink,
    leaks,
    metrics_text,
    oversize_values,
    redis_bytes,
)

SECRET = "hostile-secret-5d1e8b"
ID_HEADERS_AGENT = str(REPO / "tests/agents/id_headers_v2.py")

MAX_WORKER_RSS = 600 * MiB
RSS_GUARD = 4096 * MiB  # a worker tree over this is killed: the case has failed already
MAX_REDIS_VALUE = 16 * MiB  # ROLLOUT_FLEET_RESULT_MAX_MB's default
CAP_SETTING = "MAX_ANSWER_MB"  # of OSMOSIS_ROLLOUT_CLIENT_MAX_ANSWER_MB

HOSTILE_ROLLOUTS = 3
NORMAL_ROLLOUTS = 2

# The SDK's retries: 2 attempts per chat call and per callback, each bounded by the client's
# 10 s connect time plus OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS (2, from TEST_ENV).
CHAT_RETRIES = 1
CALLBACK_RETRIES = 1
ATTEMPT_SECONDS = 10 + 2
V1_LIMIT = 2 * (CHAT_RETRIES + 1) * ATTEMPT_SECONDS + 10  # chat, then callback, then slack
V2_AGENT_TIMEOUT = 8
V2_LIMIT = V2_AGENT_TIMEOUT + 12
CASE_TIMEOUT = 120  # pytest-timeout's hard stop; the limits above end a case well before

TARGETS = ["v1-chat", "v2-chat", "v1-callback"]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[HostileEndpoint]:
    server = HostileEndpoint(SECRET)
    yield server
    server.close()


@pytest.fixture
def traces() -> Iterator[TraceSink]:
    sink = TraceSink()
    yield sink
    sink.close()


def fleet_env(traces: TraceSink) -> dict[str, str]:
    return {
        "OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": str(CHAT_RETRIES),
        "OSMOSIS_ROLLOUT_CLIENT_COMPLETE_ROLLOUT_RETRIES": str(CALLBACK_RETRIES),
        "ROLLOUT_FLEET_TRACING": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": traces.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def one_worker(start_fleet: StartFleet, target: str, env: dict[str, str]) -> FleetUnderTest:
    """A fleet of one gateway and one worker at the product's default concurrency: the v2
    agent for ``v2-chat``, the scripted v1 agent otherwise."""
    if target == "v2-chat":
        return start_fleet(
            ID_HEADERS_AGENT,
            workers=1,
            gateways=1,
            concurrency=None,
            handle=V2FleetUnderTest,
            env={**V2_ENV, **env},
        )
    return start_fleet(SCRIPTED_AGENT, workers=1, concurrency=None, env=env)


def worker_pids(handle: FleetUnderTest) -> list[int]:
    return [
        process.pid
        for name, process in handle.fleet.processes.items()
        if name.startswith("worker-") and process.alive()
    ]


@dataclass
class Outcome:
    """What one rollout came to."""

    rollout_id: str
    hostile: bool
    ended_after: float | None = None  # seconds from admission; None: not within its limit
    view: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)  # v2's final poll body


def view_of(handle: FleetUnderTest, rollout_id: str) -> dict[str, Any]:
    response = handle.http.get(f"/v1/rollouts/{rollout_id}")
    return response.json() if response.status_code == 200 else {"http": response.status_code}


def wait_ended(handle: FleetUnderTest, outcomes: list[Outcome], limit: float) -> None:
    """Watch the records until every rollout is terminal or ``limit`` seconds have passed
    since now; note when each ended."""
    start = time.monotonic()
    while time.monotonic() < start + limit and any(o.ended_after is None for o in outcomes):
        for outcome in outcomes:
            if (
                outcome.ended_after is None
                # the status alone: a record may hold a result of hundreds of MB
                and handle.redis.hget(handle.record_key(outcome.rollout_id), "status") in TERMINAL
            ):
                outcome.ended_after = time.monotonic() - start
        time.sleep(0.1)


def run_v1(
    handle: FleetUnderTest,
    endpoint: HostileEndpoint,
    target: str,
    mode: Mode,
    count: int = HOSTILE_ROLLOUTS,
) -> tuple[list[Outcome], str]:
    outcomes = []
    for index in range(count + NORMAL_ROLLOUTS):
        hostile = index < count
        chat, callback = Mode.NORMAL, Mode.NORMAL
        if hostile and target == "v1-chat":
            chat = mode
        elif hostile:
            callback = mode
        outcome = Outcome(new_id(f"{mode}-{index}"), hostile)
        body = handle.body(outcome.rollout_id, server_url=endpoint.server_url(chat, callback))
        assert handle.init(body).status_code == 202
        outcomes.append(outcome)
    wait_ended(handle, outcomes, V1_LIMIT)
    time.sleep(1.5)  # a repeated callback, if any, arrives
    views = ""
    for outcome in outcomes:
        outcome.view = view_of(handle, outcome.rollout_id)
        views += json.dumps(outcome.view) + "\n"
    return outcomes, views


def run_v2(
    handle: V2FleetUnderTest, endpoint: HostileEndpoint, mode: Mode, count: int = HOSTILE_ROLLOUTS
) -> tuple[list[Outcome], str]:
    outcomes, tokens = [], {}
    for index in range(count + NORMAL_ROLLOUTS):
        hostile = index < count
        outcome = Outcome(new_id(f"{mode}-{index}"), hostile)
        body = handle.body(
            outcome.rollout_id,
            chat_completions_url=endpoint.chat_url(mode if hostile else Mode.NORMAL),
            agent_timeout_sec=V2_AGENT_TIMEOUT,
            metadata={"path": "openai", "sample": outcome.rollout_id},
        )
        response = handle.admit(body)
        assert response.status_code == 202, response.text
        tokens[outcome.rollout_id] = response.json()["polling_lease_token"]
        outcomes.append(outcome)
    wait_ended(handle, outcomes, V2_LIMIT)
    views = ""
    for outcome in outcomes:
        if outcome.ended_after is not None:  # the final poll answers at once
            polled = handle.poll(outcome.rollout_id, tokens[outcome.rollout_id])
            outcome.result = polled.json() if polled.status_code == 200 else {}
        outcome.view = view_of(handle, outcome.rollout_id)
        views += json.dumps(outcome.view) + "\n" + json.dumps(outcome.result) + "\n"
    return outcomes, views


def judge(target: str, mode: Mode, outcomes: list[Outcome], endpoint: HostileEndpoint) -> list[str]:
    """Every way these outcomes fall short."""
    problems = []
    limit = V2_LIMIT if target == "v2-chat" else V1_LIMIT
    for outcome in outcomes:
        name = f"{'hostile' if outcome.hostile else 'normal'} {outcome.rollout_id}"
        if outcome.ended_after is None:
            problems.append(f"{name}: not ended within {limit}s: {outcome.view}")
            continue
        if outcome.view.get("attempt") != 1:
            problems.append(f"{name}: ran {outcome.view.get('attempt')} times: {outcome.view}")
        callbacks = endpoint.count(outcome.rollout_id, "callback")
        if target != "v2-chat" and (not outcome.hostile or target == "v1-chat") and callbacks != 1:
            problems.append(f"{name}: {callbacks} callbacks to the trainer, not 1")
        if not outcome.hostile:
            status = (
                outcome.result.get("status") if target == "v2-chat" else outcome.view.get("status")
            )
            if status != "success":
                problems.append(f"{name}: a normal rollout ended {status}: {outcome.view}")
        elif target == "v1-callback":
            problems += [
                f"{name}: {problem}" for problem in judge_callback(mode, outcome, callbacks)
            ]
        else:
            problems += [f"{name}: {problem}" for problem in judge_chat(target, mode, outcome)]
    return problems


def judge_callback(mode: Mode, outcome: Outcome, callbacks: int) -> list[str]:
    """A rollout whose callback met the hostile answer: bounded attempts; an over-size answer
    either not read (delivered) or refused naming the cap."""
    problems = []
    if not 1 <= callbacks <= CALLBACK_RETRIES + 1:
        problems.append(f"{callbacks} callback attempts (at most 1 + {CALLBACK_RETRIES} retries)")
    delivery = str(outcome.view.get("delivery"))
    if mode in OVERSIZE and not (delivery.startswith("delivered") or CAP_SETTING in delivery):
        problems.append(f"delivery neither delivered nor naming {CAP_SETTING}: {outcome.view}")
    return problems


def judge_chat(target: str, mode: Mode, outcome: Outcome) -> list[str]:
    """A rollout whose chat met the hostile answer: a failure, naming the cap if over-size."""
    problems = []
    if target == "v1-chat":
        status, error = outcome.view.get("status"), str(outcome.view.get("error"))
    else:
        status, error = outcome.result.get("status"), str(outcome.result.get("err_message"))
    if status != "failure":
        problems.append(f"ended {status}, not failure: {error[:300]}")
    if mode in OVERSIZE and CAP_SETTING not in error:
        problems.append(f"the error does not name {CAP_SETTING}: {error[:300]}")
    return problems


@pytest.mark.timeout(CASE_TIMEOUT)
@pytest.mark.parametrize("mode", HOSTILE, ids=str)
@pytest.mark.parametrize("target", TARGETS)
def test_a_hostile_answer_fails_its_rollouts_and_nothing_else(
    start_fleet: StartFleet,
    endpoint: HostileEndpoint,
    traces: TraceSink,
    target: str,
    mode: Mode,
) -> None:
    handle = one_worker(start_fleet, target, fleet_env(traces))
    watch = RssWatch(lambda: worker_pids(handle), guard=RSS_GUARD)
    idle = watch.idle()
    with watch, supervised(handle.fleet) as restarted:
        if isinstance(handle, V2FleetUnderTest):
            outcomes, views = run_v2(handle, endpoint, mode)
        else:
            outcomes, views = run_v1(handle, endpoint, target, mode)
        time.sleep(1)  # the last spans are exported
    problems = judge(target, mode, outcomes, endpoint)
    if restarted:
        problems.append(f"workers ended and were started again: {restarted}")
    if watch.guard_tripped_at is not None:
        problems.append(f"worker tree killed at {watch.guard_tripped_at / MiB:.0f} MiB RSS")
    if watch.peak > MAX_WORKER_RSS:
        problems.append(f"worker peak RSS {watch.peak / MiB:.0f} MiB (idle {idle / MiB:.0f})")

    store = redis.Redis.from_url(handle.fleet.redis_url, socket_timeout=120)
    try:
        problems += [
            f"Redis value over 16 MiB: {o}" for o in oversize_values(store, MAX_REDIS_VALUE)
        ]
        dump: str | bytes
        try:
            dump = redis_dump(handle.redis)
        except (UnicodeDecodeError, redis.RedisError):  # not text, or too large to read soon
            dump = redis_bytes(store)
        metric_urls = [f"{url}/metrics" for url in handle.fleet.gateway_urls]
        problems += [
            f"secret in {found}"
            for found in leaks(
                SECRET,
                {
                    "views": views,
                    "redis": dump,
                    "logs": all_logs(handle),
                    "metrics": metrics_text(metric_urls + handle.fleet.worker_metrics_urls()),
                    "traces": traces.received(),
                },
            )
        ]
    finally:
        store.close()
    if not traces.exports:
        problems.append("no trace was exported: the trace check saw nothing")

    record = {
        "target": target,
        "mode": str(mode),
        "idle_rss_mib": round(idle / MiB),
        "peak_rss_mib": round(watch.peak / MiB),
        "guard_tripped": watch.guard_tripped_at is not None,
        "workers_restarted": restarted,
        "ended_after": {o.rollout_id: o.ended_after for o in outcomes},
        "views": [o.view for o in outcomes],
        "problems": [problem[:600] for problem in problems],
    }
    out = REPO / "test-output" / "hostile-matrix"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{target}-{mode}.json").write_text(json.dumps(record, indent=2, default=str))
    assert not problems, "\n".join(problem[:600] for problem in problems)


STORM = 100  # the product's default worker concurrency: every slot meets the hostile answer


@pytest.mark.timeout(CASE_TIMEOUT)
@pytest.mark.parametrize("target", ["v1-chat", "v2-chat"])
def test_a_storm_of_hostile_answers_keeps_a_worker_within_its_bound(
    start_fleet: StartFleet, endpoint: HostileEndpoint, target: str
) -> None:
    """A hundred rollouts at once, every one meeting a 100 MB valid JSON answer gzipped to
    100 KB, on a worker at the default concurrency and caps: its peak RSS stays under
    600 MiB (the caps bound what is read at once, ``OSMOSIS_ROLLOUT_CLIENT_ANSWERS_IN_FLIGHT
    _MB``, and what a refused read leaves behind), and every rollout ends once, the hostile
    ones failed. Which failure a hostile rollout gets depends on when its calls found room to
    read (over the cap, or its deadline while retrying): not judged here; an ordinary one
    beside them succeeds unless the shared in-flight budget was spent for it."""
    mode = Mode.GZIP_JSON_100MB
    env = {
        "OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": str(CHAT_RETRIES),
        "OSMOSIS_ROLLOUT_CLIENT_COMPLETE_ROLLOUT_RETRIES": str(CALLBACK_RETRIES),
    }
    handle = one_worker(start_fleet, target, env)
    watch = RssWatch(lambda: worker_pids(handle), guard=RSS_GUARD)
    idle = watch.idle()
    with watch, supervised(handle.fleet) as restarted:
        if isinstance(handle, V2FleetUnderTest):
            outcomes, views = run_v2(handle, endpoint, mode, STORM)
        else:
            outcomes, views = run_v1(handle, endpoint, target, mode, STORM)
    assert not restarted
    assert watch.peak < MAX_WORKER_RSS, f"peak {watch.peak / MiB:.0f} MiB, idle {idle / MiB:.0f}"
    assert all(o.ended_after is not None for o in outcomes)
    assert all(o.view.get("attempt") == 1 for o in outcomes), views
    for outcome in outcomes:
        if target == "v2-chat":
            status, error = outcome.result.get("status"), outcome.result.get("err_message")
        else:
            status, error = outcome.view["status"], outcome.view.get("error")
        if outcome.hostile:
            assert status == "failure", outcome.view
        elif status != "success":
            # The in-flight budget is the process's, shared by every rollout on it: under a
            # storm an ordinary call may find it spent (a documented limit). It says so, or
            # ran out of its time retrying.
            assert "ANSWERS_IN_FLIGHT_MB" in str(error) or "deadline" in str(error), error
    assert not leaks(SECRET, {"views": views, "logs": all_logs(handle)})
