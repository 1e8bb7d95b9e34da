"""Helpers for tests that drive a real fleet: request bodies, the mock TrainGate's admin API,
and a handle on a running fleet (its gateway, its Redis database, its process logs)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import redis
from celery import Celery

from rollout_core.queue.broker import control_exchange
from rollout_core.store.schema import Keys, Protocol
from rollout_fleet.local import LocalFleet, fleet_command
from rollout_fleet.processes import ManagedProcess, free_port, port_open, wait_until
from rollout_sdk.client import RolloutClient

REPO = Path(__file__).resolve().parent.parent
SCRIPTED_AGENT = f"{REPO / 'tests/agents/scripted_v1.py'}:agent_loop"
SCRIPTED_V2_AGENT = str(REPO / "tests/agents/scripted_v2.py")  # found by discovery
CALCULATOR_AGENT = f"{REPO / 'examples/calculator/server.py'}:agent_loop"
CALCULATOR_DATASET = REPO / "examples/calculator/test_data.jsonl"
STRANDS_AGENT = str(REPO / "examples/strands_multiply/main.py")


def agent_failing_in_the_gateway(folder: Path) -> Path:
    """An agent file that loads (the scripted agent) everywhere but in a gateway process."""
    agent = folder / "not_in_the_gateway.py"
    scripted = SCRIPTED_AGENT.rsplit(":", 1)[0]
    agent.write_text(
        "import runpy\nimport sys\n\n"
        f"agent_loop = runpy.run_path({scripted!r})['agent_loop']\n"
        "if 'gateway' in sys.argv:\n"
        "    raise RuntimeError('this agent does not load in the gateway')\n"
    )
    return agent


@contextlib.contextmanager
def supervised(fleet: LocalFleet, every: float = 0.2) -> Iterator[list[str]]:
    """What a supervisor (compose's restart policy) does, in a thread while the block runs:
    start dead workers again. Yields the names restarted, in order."""
    restarted: list[str] = []
    done = threading.Event()

    def supervise() -> None:
        while not done.wait(every):
            restarted.extend(fleet.restart_dead_workers())

    supervisor = threading.Thread(target=supervise, daemon=True)
    supervisor.start()
    try:
        yield restarted
    finally:
        done.set()
        supervisor.join()


def new_id(prefix: str = "r") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def v1_body(server_url: str, rollout_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A minimal valid ``POST /v1/rollout/init`` body, plus any overrides."""
    body: dict[str, Any] = {
        "rollout_id": new_id() if rollout_id is None else rollout_id,
        "server_url": server_url,
        "messages": [{"role": "user", "content": "Hello"}],
        "completion_params": {},
    }
    body.update(fields)
    return body


def calculator_bodies(server_url: str, count: int, **fields: Any) -> list[dict[str, Any]]:
    """``count`` v1 rollouts over the calculator dataset; every 10th has a wrong ground truth."""
    rows = [json.loads(line) for line in CALCULATOR_DATASET.read_text().splitlines()]
    bodies = []
    for index in range(count):
        row = rows[index % len(rows)]
        truth = row["ground_truth"] if index % 10 else "-1"
        bodies.append(
            v1_body(
                server_url,
                new_id(f"calc{index}"),
                messages=[
                    {"role": "system", "content": row["system_prompt"]},
                    {"role": "user", "content": row["user_prompt"]},
                ],
                completion_params={"temperature": 0.7, "max_tokens": 256},
                metadata={"ground_truth": truth},
                **fields,
            )
        )
    return bodies


def admit_all(gateway: httpx.Client, bodies: list[dict[str, Any]]) -> None:
    """Admit v1 rollouts 16 at a time; every one must be accepted."""
    with ThreadPoolExecutor(16) as pool:
        statuses = Counter(
            pool.map(lambda body: gateway.post("/v1/rollout/init", json=body).status_code, bodies)
        )
    assert statuses == {202: len(bodies)}


async def run_v2_dataset(
    gateway_url: str, trainer_url: str, example: Path, count: int, api_key: str | None = None
) -> dict[str, tuple[dict[str, Any], str]]:
    """``count`` v2 rollouts over ``example``'s dataset through a trainer client, every 10th
    with a wrong label: ``{rollout id: (final result, label)}``."""
    dataset = [json.loads(line) for line in (example / "test_data.jsonl").read_text().splitlines()]

    async def one(index: int, client: RolloutClient) -> tuple[str, dict[str, Any], str]:
        row = dataset[index % len(dataset)]
        label = row["ground_truth"] if index % 10 else "-1"
        rollout_id = new_id(f"{example.name}{index}")
        result = await client.run_rollout(
            initial_messages=[
                {"role": "system", "content": row["system_prompt"]},
                {"role": "user", "content": row["user_prompt"]},
            ],
            chat_completions_url=f"{trainer_url}/v1/rollouts/{rollout_id}",
            rollout_id=rollout_id,
            llm_api_key=f"key-{rollout_id}",
            label=label,
        )
        return rollout_id, result.model_dump(mode="json"), label

    async with RolloutClient(url=gateway_url, api_key=api_key) as client:
        done = await asyncio.gather(*(one(i, client) for i in range(count)))
    return {rollout_id: (result, label) for rollout_id, result, label in done}


def redis_dump(store: redis.Redis) -> str:
    """Every key with its value, whatever its type."""
    readers: dict[str, Callable[[str], Any]] = {
        "string": store.get,
        "hash": store.hgetall,
        "list": lambda key: store.lrange(key, 0, -1),
        "set": store.smembers,
        "zset": lambda key: store.zrange(key, 0, -1, withscores=True),
    }
    lines = []
    for key in store.scan_iter(count=1000):
        kind = str(store.type(key))
        lines.append(f"{key} {kind} {readers[kind](key)}" if kind in readers else f"{key} {kind}")
    return "\n".join(lines)


def script(*steps: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """``metadata`` for the scripted agent."""
    return {"script": list(steps), **metadata}


@dataclass
class MockTrainGateClient:
    """Drives a mock TrainGate process through its ``/mock`` admin API."""

    url: str
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))

    def add_faults(self, *faults: dict[str, Any]) -> None:
        self.http.post(f"{self.url}/mock/faults", json=list(faults)).raise_for_status()

    def configure(self, **config: Any) -> None:
        self.http.post(f"{self.url}/mock/config", json=config).raise_for_status()

    def calls(self, path: str | None = None, rollout_id: str | None = None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("path", path), ("rollout_id", rollout_id)) if v}
        response = self.http.get(f"{self.url}/mock/calls", params=params)
        response.raise_for_status()
        calls: list[dict[str, Any]] = response.json()
        return calls

    def deliveries(self) -> dict[str, list[dict[str, Any]]]:
        response = self.http.get(f"{self.url}/mock/deliveries")
        response.raise_for_status()
        deliveries: dict[str, list[dict[str, Any]]] = response.json()
        return deliveries

    def reset(self) -> None:
        self.http.post(f"{self.url}/mock/reset").raise_for_status()


@dataclass
class FleetUnderTest:
    """A started :class:`LocalFleet` plus the clients a test needs to observe it."""

    fleet: LocalFleet
    trainer: MockTrainGateClient
    redis: redis.Redis = field(init=False)
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.redis = redis.Redis.from_url(self.fleet.redis_url, decode_responses=True)
        self.http = httpx.Client(base_url=self.fleet.gateway_url, timeout=30)

    @property
    def prefix(self) -> str:
        return self.fleet.key_prefix

    def body(self, rollout_id: str | None = None, **fields: Any) -> dict[str, Any]:
        return v1_body(fields.pop("server_url", self.trainer.url), rollout_id, **fields)

    def init(self, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
        return self.http.post("/v1/rollout/init", json=body, **kwargs)

    protocol: Protocol = "v1"

    @property
    def keys(self) -> Keys:
        """The fleet's key names."""
        return Keys(self.prefix)

    def record_key(self, key: str) -> str:
        return self.keys.record(self.protocol, key)

    def record(self, key: str) -> dict[str, str]:
        return self.redis.hgetall(self.record_key(key))  # type: ignore[return-value]

    def wait_delivered(
        self, rollout_ids: list[str] | set[str], timeout: float = 60
    ) -> dict[str, list[dict[str, Any]]]:
        """Wait until every id has at least one completion callback; return all deliveries."""
        wanted = set(rollout_ids)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            deliveries = self.trainer.deliveries()
            if wanted <= deliveries.keys():
                return deliveries
            time.sleep(0.1)
        missing = wanted - self.trainer.deliveries().keys()
        raise AssertionError(
            f"{len(missing)} rollouts never delivered (e.g. {sorted(missing)[:3]})\n{self.logs()}"
        )

    def wait_status(self, key: str, statuses: set[str], timeout: float = 30) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.record(key)
            if record.get("status") in statuses:
                return record
            time.sleep(0.05)
        raise AssertionError(f"{key} never reached {statuses}: {self.record(key)}\n{self.logs()}")

    def revoke(self, rollout_id: str) -> None:
        """What Flower's Revoke button sends: a Celery revoke of the rollout's task."""
        app = Celery(broker=self.fleet.redis_url)
        app.conf.control_exchange = control_exchange(self.keys.prefix)
        try:
            app.control.revoke(self.record(rollout_id)["task"])
        finally:
            app.close()

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {name} ---\n{process.output()[-tail:]}"
            for name, process in self.fleet.processes.items()
        )

    def close(self) -> None:
        self.fleet.stop()
        self.http.close()
        self.redis.close()


def admit_v1(handle: FleetUnderTest, rollout_id: str, **fields: object) -> None:
    """Admit a v1 rollout with these body fields; the gateway must answer 202."""
    response = handle.init(handle.body(rollout_id, **fields))
    assert response.status_code == 202, response.text


LEASE_HEADER = "X-Osmosis-Rollout-Lease"
TERMINAL = {"success", "failure", "cancelled"}


def v2_body(trainer_url: str, rollout_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A valid ``POST /rollout`` body for the calculator question ``6 * 7``."""
    rollout_id = new_id("v2") if rollout_id is None else rollout_id
    body: dict[str, Any] = {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": "What is 6 * 7?"}],
        "chat_completions_url": f"{trainer_url}/v1/rollouts/{quote(rollout_id, safe='')}",
        "label": "42",
    }
    body.update(fields)
    return body


@dataclass
class V2FleetUnderTest(FleetUnderTest):
    """A v2 fleet: admissions go to the first gateway, polls to the last one."""

    protocol: Protocol = "v2"
    poller: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        key = self.fleet.env.get("ROLLOUT_FLEET_API_KEY")
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        self.http.headers.update(auth)
        self.poller = httpx.Client(base_url=self.fleet.gateway_urls[-1], timeout=60, headers=auth)

    def body(self, rollout_id: str | None = None, **fields: Any) -> dict[str, Any]:
        return v2_body(self.trainer.url, rollout_id, **fields)

    def admit(self, body: dict[str, Any]) -> httpx.Response:
        return self.http.post("/rollout", json=body)

    def poll(self, rollout_id: str, token: str) -> httpx.Response:
        path = f"/rollout/{quote(rollout_id, safe='')}/result"
        return self.poller.get(path, headers={LEASE_HEADER: token})

    def admitted(self, **fields: Any) -> tuple[str, str]:
        """Admit a rollout; its (id, lease token)."""
        body = self.body(**fields)
        response = self.admit(body)
        assert response.status_code == 202, response.text
        return body["rollout_id"], response.json()["polling_lease_token"]

    def result(self, rollout_id: str, token: str, timeout: float = 60) -> dict[str, Any]:
        """Long-poll until the rollout is terminal; the final body."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.poll(rollout_id, token)
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            if body["status"] in TERMINAL:
                return body
        raise AssertionError(f"{rollout_id} not finished after {timeout}s\n{self.logs()}")

    def run(self, **fields: Any) -> dict[str, Any]:
        """Admit, then poll to the end: the final result."""
        return self.result(*self.admitted(**fields))

    def close(self) -> None:
        super().close()
        self.poller.close()


class InternalService:
    """A service inside the fleet's network that a trainer-chosen URL must never read back:
    answers every POST with ``status`` and a JSON body carrying ``secret``."""

    def __init__(self, status: int, secret: str) -> None:
        self.status = status
        body = json.dumps({"credentials": secret, "choices_missing": True}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class PartitionProxy:
    """A TCP proxy to ``target`` whose path can be cut and healed like a network partition.

    While cut, nothing crosses either way: what either side sends is held, as a partitioned
    network holds it (new connections are accepted, then carry nothing). Healing delivers
    what was held and carries on. A connection its client closes while cut (it gave up: a
    command timed out) is dropped with whatever it had not delivered (see
    :meth:`wait_for_give_up`). One proxy per process cuts processes off one at a time."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = False
        self._pipes: list[_HeldPipe] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._given_up = threading.Event()  # a client closed a connection while cut
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    def url(self, database: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{database}"

    def cut(self) -> None:
        """From now on nothing crosses, either way, on any connection."""
        self._cut = True

    def wait_for_give_up(self, timeout: float) -> bool:
        """Wait, while cut, until a client gives up a connection (closes it: a command of its
        timed out); whether one did within ``timeout`` seconds."""
        self._given_up.clear()
        return self._given_up.wait(timeout)

    def heal(self) -> None:
        """Deliver what was held, then carry everything again."""
        with self._lock:
            self._cut = False
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.flush()

    @property
    def is_cut(self) -> bool:
        return self._cut

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            _drop(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                _drop(client)  # the target is down: refused, as it would be directly
                continue
            self._link(client, upstream)

    def _link(self, client: socket.socket, upstream: socket.socket) -> None:
        """Carry one connection: a pump thread each way."""
        to_upstream, to_client = _HeldPipe(self, upstream), _HeldPipe(self, client)
        with self._lock:
            self._sockets += [client, upstream]
            self._pipes += [to_upstream, to_client]
        ends = (client, upstream)
        for source, pipe in ((client, to_upstream), (upstream, to_client)):
            pump = (source, pipe, source is client, ends)
            threading.Thread(target=self._pump, args=pump, daemon=True).start()

    def _pump(
        self,
        source: socket.socket,
        pipe: _HeldPipe,
        from_client: bool,
        ends: tuple[socket.socket, socket.socket],
    ) -> None:
        """Carry one direction of one connection until either end closes it."""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                pipe.send(data)
        if from_client and self._cut:
            self._given_up.set()
        with self._lock:
            self._pipes.remove(pipe)
            self._sockets = [sock for sock in self._sockets if sock not in ends]
        for sock in ends:
            _drop(sock)


class _HeldPipe:
    """One direction of one proxied connection: holds what is sent while its proxy is cut."""

    def __init__(self, proxy: PartitionProxy, destination: socket.socket) -> None:
        self._proxy = proxy
        self._destination = destination
        self._held = bytearray()
        self._lock = threading.Lock()  # keeps held bytes ahead of newer ones

    def send(self, data: bytes) -> None:
        with self._lock:
            self._held += data
            if not self._proxy.is_cut:
                self._deliver()

    def flush(self) -> None:
        with self._lock:
            self._deliver()

    def _deliver(self) -> None:
        with contextlib.suppress(OSError):  # the other end is gone: its pump drops the link
            self._destination.sendall(self._held)
        self._held.clear()


def _drop(sock: socket.socket) -> None:
    """Close ``sock``, waking a thread blocked on it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def screenshot_dir(name: str) -> Path:
    """Where a test keeps what it saw (``test-output/`` is git-ignored)."""
    folder = REPO / "test-output" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def start_mock_trainer(responder: str, log_dir: Path) -> tuple[ManagedProcess, MockTrainGateClient]:
    """A mock TrainGate process answering with ``responder``; stop the process when done."""
    port = free_port()
    process = ManagedProcess(
        "mock-trainer",
        fleet_command("mock-trainer", "--port", str(port), "--responder", responder),
        dict(os.environ),
        log_dir / "mock-trainer.log",
    ).start()
    wait_until(lambda: port_open(port), 30, "the mock TrainGate")
    return process, MockTrainGateClient(f"http://127.0.0.1:{port}")


def fleet_cli(handle: FleetUnderTest, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fleet_command(*args),
        env=handle.fleet.process_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def exported(handle: FleetUnderTest, tmp_path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """What ``rollout-fleet export -o FILE`` wrote: its lines by rollout id, and its text."""
    out = tmp_path / "trajectories.jsonl"
    done = fleet_cli(handle, "export", "-o", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    return {line["rollout_id"]: line for line in map(json.loads, text.splitlines())}, text


def all_logs(handle: FleetUnderTest) -> str:
    return "\n".join(process.output() for process in handle.fleet.processes.values())


def quick_start_commands() -> list[str]:
    """The README's quick-start commands, in order."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def run_point(
    point: str, scale: str, timeout: float = 240
) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    """Run one bench point at ``scale``: the finished process and its JSON figure lines."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", point, "--scale", scale],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


class Subscription:
    """Every message the fleet's Redis publishes on ``channel`` (a pattern if ``pattern``)
    while inside, as published; ``settle`` seconds at the end let the last ones arrive."""

    def __init__(
        self, fleet: FleetUnderTest, channel: str, *, pattern: bool = False, settle: float = 0.3
    ) -> None:
        self._pubsub = fleet.redis.pubsub()  # type: ignore[no-untyped-call]
        if pattern:
            self._pubsub.psubscribe(channel)
        else:
            self._pubsub.subscribe(channel)
        self.settle = settle
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def __enter__(self) -> Subscription:
        self._thread.start()
        return self

    def _listen(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.1)
            if message and message["type"] in {"message", "pmessage"}:
                data = message["data"]
                self.messages.append(data.decode() if isinstance(data, bytes) else str(data))

    def __exit__(self, *_: Any) -> None:
        time.sleep(self.settle)
        self._stop.set()
        self._thread.join()
        self._pubsub.close()


class EventChannel(Subscription):
    """Every task-event message the fleet's Redis carries while inside."""

    def __init__(self, fleet: FleetUnderTest) -> None:
        # A flush period and more at the end: the last events are out.
        super().__init__(fleet, "/*.celeryev/task.*", pattern=True, settle=1.0)

    def events(self) -> list[dict[str, Any]]:
        """The events, unpacked as Celery's receiver unpacks them (a list is a batch)."""
        unpacked: list[dict[str, Any]] = []
        for message in self.messages:
            body = json.loads(base64.b64decode(json.loads(message)["body"]))
            unpacked.extend(body if isinstance(body, list) else [body])
        return unpacked


def run_process(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a fleet command to its end from the repository, its output captured."""
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def assert_one_line(result: subprocess.CompletedProcess[str], line: str) -> None:
    """A refusal: a non-zero exit, no traceback, and ``line`` said once, at the end of its
    output line (after a log line's time and level, if any)."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output
    saying = [said for said in output.splitlines() if line in said]
    assert len(saying) == 1, output
    assert saying[0].endswith(line), output
