"""A v1 rollout's completion callback: once for any id the schema accepts, keyed per
admission, never posted by an execution that lost its lease, and every failure on the way
ends the rollout instead of retrying it for ever. Real gateways, workers, redis-server and
trainers (the mock TrainGate, or a bare HTTP receiver whose door the test opens)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import SCRIPTED_V2_AGENT, FleetUnderTest, new_id, script, supervised, v2_body

COMPLETE_AT_ONCE = script({"complete": {}})  # no LLM call: the callback is the only request


def header(call: dict[str, Any], name: str) -> str:
    return {k.lower(): v for k, v in call["headers"].items()}[name.lower()]


@pytest.fixture(scope="module")
def handle(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    fleet = start_fleet(workers=2, env={"ROLLOUT_FLEET_RECORD_TTL_SECONDS": "2"})
    yield fleet
    fleet.close()


IDS = [
    ("rollout-é-1", None),
    ("日本語-ロールアウト", None),
    ("emoji-🚀", "key-🔑"),
    ("plain", "line\r\nbreak"),
    ("tab\tand\x7fdel", "nul-less \x01 control"),
    ("x" * 256, "ü" * 300),
]


@pytest.mark.parametrize(("rollout_id", "idempotency_key"), IDS)
def test_any_valid_id_gets_exactly_one_callback_with_a_header_safe_key(
    handle: FleetUnderTest, rollout_id: str, idempotency_key: str | None
) -> None:
    """Non-ASCII, control characters and CR/LF in ``rollout_id`` or ``idempotency_key``: the
    rollout ends ``success``, delivered once (before: building the ``Idempotency-Key`` header
    raised, the rollout went back to the queue for ever, and a CR/LF key ended ``success``
    without a callback)."""
    rollout_id = f"{rollout_id}-{new_id()}"[-256:]
    fields: dict[str, Any] = {"metadata": COMPLETE_AT_ONCE}
    if idempotency_key is not None:
        fields["idempotency_key"] = f"{idempotency_key}-{new_id()}"[-256:]
    response = handle.init(handle.body(rollout_id, **fields))
    assert response.status_code == 202, response.text
    key = fields.get("idempotency_key", rollout_id)
    record = handle.wait_status(key, {"success", "failure"})
    assert (record["status"], record["delivery"], record["attempt"]) == (
        "success",
        "delivered",
        "1",
    ), record
    (call,) = handle.trainer.calls("completed", rollout_id)
    assert header(call, "Idempotency-Key") == record["admit_token"]
    assert [c["status"] for c in handle.trainer.deliveries()[rollout_id]] == ["COMPLETED"]


def test_an_id_admitted_again_after_its_record_expired_gets_a_new_idempotency_key(
    handle: FleetUnderTest,
) -> None:
    """A receiver that drops repeats by key must not drop a new admission's callback."""
    rollout_id = new_id("again")
    keys = []
    for _ in range(2):
        response = handle.init(handle.body(rollout_id, metadata=COMPLETE_AT_ONCE))
        assert response.status_code == 202, response.text
        handle.wait_status(rollout_id, {"success"})
        deadline = time.monotonic() + 20
        while handle.record(rollout_id) and time.monotonic() < deadline:
            time.sleep(0.2)  # the record's retention (2 s) runs out: the id is new again
        keys = [header(c, "Idempotency-Key") for c in handle.trainer.calls("completed", rollout_id)]
    assert len(keys) == 2, keys
    assert keys[0] != keys[1]
    warning = "ROLLOUT_FLEET_RECORD_TTL_SECONDS=2: a finished rollout is forgotten that soon"
    assert warning in handle.logs(tail=1_000_000)  # a TTL that short is said at start


@pytest.mark.parametrize(
    ("field_name", "key"),
    [("api_key", "ключ-123"), ("api_key", "two words"), ("api_key", "sk-1\r\nX-Evil: 1")],
)
def test_a_v1_key_that_cannot_be_sent_is_refused_at_admission_without_echoing_it(
    handle: FleetUnderTest, field_name: str, key: str
) -> None:
    rollout_id = new_id("badkey")
    response = handle.init(handle.body(rollout_id, **{field_name: key}))
    assert response.status_code == 422, response.text
    assert field_name in response.text
    assert "Bearer" in response.text
    assert key not in response.text
    assert json.dumps(key)[1:-1] not in response.text
    assert not handle.record(rollout_id)


def test_a_v2_key_that_cannot_be_sent_is_refused_at_admission_without_echoing_it(
    start_fleet: StartFleet,
) -> None:
    v2 = start_fleet(SCRIPTED_V2_AGENT, workers=0, env=V2_ENV)
    body = v2_body(v2.trainer.url, new_id("badkey2"), llm_api_key="sk-é")
    response = v2.http.post("/rollout", json=body)
    assert response.status_code == 422, response.text
    assert "llm_api_key" in response.text
    assert "sk-é" not in response.text
    assert "sk-\\u00e9" not in response.text


def test_a_callback_that_fails_the_same_way_every_time_ends_the_rollout_once(
    start_fleet: StartFleet,
) -> None:
    """Any failure while posting (here a header the worker cannot encode, planted in the
    record before a worker takes it) counts once: the rollout ends, its view saying why
    (before: only the SDK's own errors were caught; anything else went back to the queue and
    was retried for ever, the record renewed and never exhausted)."""
    handle = start_fleet(workers=0)
    rollout_id = new_id("unsendable")
    assert handle.init(handle.body(rollout_id, metadata=COMPLETE_AT_ONCE)).status_code == 202
    handle.redis.hset(handle.record_key(rollout_id), "admit_token", "tøken")
    worker = handle.fleet.start_worker(1, handle.fleet.process_env())
    try:
        record = handle.wait_status(rollout_id, {"success", "failure"}, timeout=30)
    finally:
        worker.stop()
    assert record["delivery"] == "failed: the callback could not be sent (UnicodeEncodeError)"
    assert (record["attempt"], record["terminations"]) == ("1", "1")
    view = handle.http.get(f"/v1/rollouts/{rollout_id}").json()
    assert view["delivery"] == record["delivery"]
    assert not handle.trainer.calls("completed", rollout_id)


def test_a_trainer_slower_than_the_client_timeout_gets_identical_keyed_retries_and_is_told(
    handle: FleetUnderTest,
) -> None:
    """The second documented window: a callback whose answer does not come within
    ``OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS`` (2 s here; the trainer takes 3 s) is retried,
    as the protocol says. Every attempt is the same body under the same key, and the record
    says the trainer may have received it (before: "did not answer in time", as if it had
    not)."""
    rollout_id = new_id("slow-trainer")
    handle.trainer.add_faults(
        {"target": "completed", "delay_s": 3.0, "times": 3, "rollout_id": rollout_id}
    )
    assert handle.init(handle.body(rollout_id, metadata=COMPLETE_AT_ONCE)).status_code == 202
    record = handle.wait_status(rollout_id, {"success", "failure"}, timeout=40)
    assert record["delivery"] == (
        "failed: the trainer did not answer in time (it may have received the callback)"
    )
    calls = handle.trainer.calls("completed", rollout_id)
    assert len(calls) == 3  # the first and complete_rollout_retries (2)
    assert {json.dumps(c["body"], sort_keys=True) for c in calls} == {
        json.dumps(calls[0]["body"], sort_keys=True)
    }
    assert {header(c, "Idempotency-Key") for c in calls} == {record["admit_token"]}


@pytest.mark.parametrize(
    "fault",
    [{"status": 502}, {"delay_s": 3.0}, {"reset": True}],
    ids=["5xx", "past-the-timeout", "reset"],
)
def test_a_callback_accepted_on_a_retry_says_the_trainer_may_have_received_the_earlier(
    handle: FleetUnderTest, fault: dict[str, Any]
) -> None:
    """A first attempt sent whole and answered 5xx, past the client timeout or with a cut
    connection is retried (the protocol's policy), and the trainer may have received it: the
    record says so once the retry is accepted, so nobody reads ``delivered`` as one callback
    (before: plain ``delivered`` while the trainer held two)."""
    rollout_id = new_id("retried")
    handle.trainer.add_faults(
        {"target": "completed", "times": 1, "rollout_id": rollout_id, **fault}
    )
    assert handle.init(handle.body(rollout_id, metadata=COMPLETE_AT_ONCE)).status_code == 202
    record = handle.wait_status(rollout_id, {"success", "failure"}, timeout=40)
    assert record["status"] == "success", record
    assert record["delivery"] == (
        "delivered on attempt 2; the trainer may have received the 1 before"
    ), record
    calls = handle.trainer.calls("completed", rollout_id)
    assert len(calls) == 2, calls
    assert {header(c, "Idempotency-Key") for c in calls} == {record["admit_token"]}


class _Dripping(BaseHTTPRequestHandler):
    """A trainer that answers 200 and then drips its body, a byte every half second."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                self.wfile.write(b"1\r\n \r\n")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            pass  # the worker gave up on it

    def log_message(self, *args: object) -> None:
        pass


def test_a_trainer_that_drips_its_answer_cannot_hold_a_rollout(start_fleet: StartFleet) -> None:
    """httpx's timeouts bound each read: a trainer sending a byte a second held a callback,
    its rollout (``delivering``) and its worker slot for ever, a cancel changing nothing. Each
    attempt is now bounded as a whole (connect + client timeout), so the rollout ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dripping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"OSMOSIS_ROLLOUT_CLIENT_COMPLETE_ROLLOUT_RETRIES": "0"}
        handle = start_fleet(workers=1, env=env)
        rollout_id = new_id("drip")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        body = handle.body(rollout_id, server_url=url, metadata=COMPLETE_AT_ONCE)
        assert handle.init(body).status_code == 202
        record = handle.wait_status(rollout_id, {"success", "failure"}, timeout=40)
        assert record["delivery"] == (
            "failed: the trainer did not answer in time (it may have received the callback)"
        )
    finally:
        server.shutdown()


# --- a trainer whose door the test opens --------------------------------------------------------


@dataclass
class Doorway:
    """A trainer on a listening socket whose accept queue is full: a worker's connection
    attempts hang (their SYNs are dropped) until :meth:`open`, which starts answering every
    callback with 200 and notes it. What a POST does is decided only once its connection is
    made, so the test can freeze or kill the worker in between."""

    sock: socket.socket = field(init=False)
    plug: socket.socket = field(init=False)
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.plug = socket.create_connection(self.sock.getsockname())  # fills the queue

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def open(self) -> None:
        callbacks = self.callbacks

        class Receiver(BaseHTTPRequestHandler):
            timeout = 5

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                callbacks.append({"headers": dict(self.headers), "body": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver, bind_and_activate=False)
        server.socket.close()
        server.socket = self.sock
        self.server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
        self.plug.close()
        self.sock.close()


@pytest.fixture
def doorway() -> Iterator[Doorway]:
    door = Doorway()
    yield door
    door.close()


def holder_pid(handle: FleetUnderTest, key: str) -> int:
    execution = handle.record(key)["execution"]
    return next(p.pid for p in handle.fleet.processes.values() if f":{p.pid}:" in execution)


def wait_taken_over(handle: FleetUnderTest, key: str, execution: str) -> None:
    deadline = time.monotonic() + 30
    while handle.record(key).get("execution", execution) == execution:
        assert time.monotonic() < deadline, handle.logs()
        time.sleep(0.05)


def test_a_worker_frozen_before_its_callback_went_out_never_posts_it(
    start_fleet: StartFleet, doorway: Doorway
) -> None:
    """The worker stored the result (``delivering``) and was connecting to the trainer when it
    froze past its lease; another worker took the rollout over and delivered it. Resumed, the
    frozen worker checks its lease before its request goes out, finds it lost and posts
    nothing (before: the delivery was shielded from the lease's cancel from the start, and the
    trainer got a second callback)."""
    handle = start_fleet(workers=2, env={"OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "20"})
    rollout_id = new_id("frozen")
    body = handle.body(rollout_id, server_url=doorway.url, metadata=COMPLETE_AT_ONCE)
    assert handle.init(body).status_code == 202
    handle.wait_status(rollout_id, {"delivering"})
    time.sleep(0.3)  # its connection attempt is under way
    frozen = holder_pid(handle, rollout_id)
    execution = handle.record(rollout_id)["execution"]
    os.kill(frozen, signal.SIGSTOP)
    try:
        wait_taken_over(handle, rollout_id, execution)
        doorway.open()
        record = handle.wait_status(rollout_id, {"success", "failure"}, timeout=40)
    finally:
        os.kill(frozen, signal.SIGCONT)
    assert record["delivery"] == "delivered", record
    time.sleep(4)  # the resumed worker's connection completes and its lease is checked
    assert len(doorway.callbacks) == 1, doorway.callbacks
    assert header(doorway.callbacks[0], "Idempotency-Key") == record["admit_token"]
    assert handle.record(rollout_id)["terminations"] == "1"


def test_a_stored_result_whose_deliverers_keep_dying_ends_undelivered_once(
    start_fleet: StartFleet, doorway: Doorway
) -> None:
    """Deliveries have a budget of their own (``ROLLOUT_FLEET_MAX_ATTEMPTS`` takeovers): a
    result whose every deliverer dies ends with its own status and a delivery line saying so,
    instead of being taken over for ever (before: a ``delivering`` rollout was never
    exhausted)."""
    handle = start_fleet(workers=3, env={"ROLLOUT_FLEET_MAX_ATTEMPTS": "1"})
    rollout_id = new_id("undeliverable")
    body = handle.body(rollout_id, server_url=doorway.url, metadata=COMPLETE_AT_ONCE)
    assert handle.init(body).status_code == 202
    handle.wait_status(rollout_id, {"delivering"})
    for _ in range(2):  # the first deliverer, then the one that took it over
        execution = handle.record(rollout_id)["execution"]
        os.kill(holder_pid(handle, rollout_id), signal.SIGKILL)
        wait_taken_over(handle, rollout_id, execution)
    record = handle.wait_status(rollout_id, {"success", "failure"}, timeout=30)
    assert record["status"] == "success"  # the agent's result stands
    assert record["delivery"] == (
        "not delivered: 2 tries, each ended by its worker stopping (crashed or killed) before "
        "the trainer's answer was recorded; the trainer may have received it"
    )
    assert (record["deliveries"], record["terminations"]) == ("2", "1")
    doorway.open()
    time.sleep(1)
    assert doorway.callbacks == []


def test_a_stopping_worker_hands_back_a_callback_that_has_not_gone_out(
    start_fleet: StartFleet,
) -> None:
    """SIGTERM while one rollout's callback is on the wire and another's waits for the
    worker's only connection (``OSMOSIS_ROLLOUT_CLIENT_MAX_CONNECTIONS=1``). At the grace's
    end the first ends saying the trainer may have it; the second is barred from posting and
    handed back, still delivering, to another worker, which posts it once. Before: the second
    went out after that check, the worker exited with it unanswered, and a takeover posted it
    again."""
    env = {
        "ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS": "1",
        "OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "40",
        "OSMOSIS_ROLLOUT_CLIENT_MAX_CONNECTIONS": "1",
    }
    handle = start_fleet(workers=1, concurrency=4, env=env)
    on_wire, waiting = new_id("on-wire"), new_id("waiting")
    handle.trainer.add_faults(
        {"target": "completed", "delay_s": 4.0, "times": 1, "rollout_id": on_wire},
        {"target": "completed", "delay_s": 10.0, "times": 1, "rollout_id": waiting},
    )
    assert handle.init(handle.body(on_wire, metadata=COMPLETE_AT_ONCE)).status_code == 202
    handle.wait_status(on_wire, {"delivering"})
    assert handle.init(handle.body(waiting, metadata=COMPLETE_AT_ONCE)).status_code == 202
    handle.wait_status(waiting, {"delivering"})
    time.sleep(0.3)  # the first holds the connection, the second waits for it
    os.kill(holder_pid(handle, waiting), signal.SIGTERM)
    handle.fleet.start_worker(2)
    first = handle.wait_status(on_wire, {"success", "failure"}, timeout=30)
    assert first["delivery"] == (
        "failed: the worker stopped before the trainer answered, after its callback went out "
        "1 time (the trainer may have it)"
    ), first
    second = handle.wait_status(waiting, {"success", "failure"}, timeout=60)
    assert (second["status"], second["delivery"], second["handoffs"]) == (
        "success",
        "delivered",
        "1",
    ), second
    time.sleep(3 * 3 + 2)  # three leases and a sweep: a takeover would have posted by now
    assert len(handle.trainer.calls("completed", waiting)) == 1
    assert len(handle.trainer.calls("completed", on_wire)) == 1


def test_a_worker_recycled_for_a_blocked_loop_ends_a_callback_whose_answer_it_never_read(
    start_fleet: StartFleet,
) -> None:
    """An agent blocks the worker's event loop while another rollout's callback is on the
    wire; the trainer answers during the block, unread. The watchdog recycles the worker:
    that rollout ends with its stored result, saying the trainer may have it, instead of
    being left to a takeover that posts it again (before: two callbacks answered 200, the
    record saying plain ``delivered``)."""
    handle = start_fleet(workers=1, env={"OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "40"})
    answered, blocker = new_id("answered"), new_id("blocks")
    handle.trainer.add_faults(
        {"target": "completed", "delay_s": 1.0, "times": 1, "rollout_id": answered}
    )
    with supervised(handle.fleet) as restarted:
        assert handle.init(handle.body(answered, metadata=COMPLETE_AT_ONCE)).status_code == 202
        handle.wait_status(answered, {"delivering"})
        blocking = script({"sleep": 0.3}, {"block": 30})  # once the callback's body is out
        assert handle.init(handle.body(blocker, metadata=blocking)).status_code == 202
        record = handle.wait_status(answered, {"success", "failure"}, timeout=30)
        failed = handle.wait_status(blocker, {"success", "failure"}, timeout=60)
        time.sleep(3 * 3 + 2)  # three leases and a sweep: a takeover would have posted by now
    assert restarted == ["worker-1"]
    assert record["status"] == "success", record
    assert record["delivery"] == (
        "failed: the worker was restarted (an agent blocked its event loop) before it read the "
        "trainer's answer, after its callback went out 1 time (the trainer may have it)"
    ), record
    assert len(handle.trainer.calls("completed", answered)) == 1
    assert failed["status"] == "failure"
    assert "blocked its worker's event loop" in json.loads(failed["result"])["error_message"]


def test_a_worker_stopping_with_its_callback_unanswered_ends_it_without_a_second(
    start_fleet: StartFleet,
) -> None:
    """SIGTERM while the trainer takes longer to answer the callback than the worker's stop
    (grace + hand-back + close, ≈ 11 s here): the stopping worker ends the rollout saying the
    trainer may have it, as a POST past the client timeout does. Before: it exited with the
    POST open, the lease lapsed, and another worker posted the stored result again (two
    callbacks answered 200, the record saying plain ``delivered``)."""
    env = {
        "ROLLOUT_FLEET_SHUTDOWN_GRACE_SECONDS": "1",
        "OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "40",
    }
    handle = start_fleet(workers=2, env=env)
    rollout_id = new_id("stopping")
    handle.trainer.add_faults(
        {"target": "completed", "delay_s": 20.0, "times": 1, "rollout_id": rollout_id}
    )
    assert handle.init(handle.body(rollout_id, metadata=COMPLETE_AT_ONCE)).status_code == 202
    handle.wait_status(rollout_id, {"delivering"})
    time.sleep(0.5)  # its POST is on the wire, the trainer sitting on it
    holder = holder_pid(handle, rollout_id)
    os.kill(holder, signal.SIGTERM)
    record = handle.wait_status(rollout_id, {"success", "failure"}, timeout=30)
    assert record["status"] == "success", record
    assert record["delivery"] == (
        "failed: the worker stopped before the trainer answered, after its callback went out "
        "1 time (the trainer may have it)"
    ), record
    deadline = time.monotonic() + 40  # the held POST is answered; a takeover would post again
    while time.monotonic() < deadline and not handle.trainer.calls("completed", rollout_id):
        time.sleep(0.5)
    time.sleep(3 * 3 + 2)  # three leases and a sweep: a requeue would have posted by now
    calls = handle.trainer.calls("completed", rollout_id)
    assert len(calls) == 1, calls
    assert handle.record(rollout_id)["delivery"] == record["delivery"]
