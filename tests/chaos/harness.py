"""The chaos suite's instruments: a fleet on its own Redis, a trainer that behaves like a
real one while things break, and the audit that checks our promise — every admitted rollout
ends with exactly one result.

A scenario: start a :class:`ChaosFleet`, start a :class:`Trainer` offering rollouts, break
something while they run, then :func:`audit`. It waits for the trainer, for every record to
end, and then long enough for anything late to show (:attr:`Timings.settle`: a callback
whose attempt was under way as its record ended), and checks (:func:`judge` says what it
found, :func:`audit` asserts it):

* v1: each admitted rollout got exactly one completion callback — or byte-identical repeats,
  each excused by a ``kill -9`` of its own in the first window RELIABILITY.md names: the
  killed worker held the rollout and the kill fell from 1 s before the repeated callback's
  arrival to the client timeout and a second after it (the worker posted, the trainer
  answered, the worker died before recording the answer; :func:`judge_repeats`);
* v1: every callback says what its record says in the end: the stored result, byte for byte,
  and COMPLETED only for a ``success``;
* v2: each admitted rollout's polls ended in a terminal result (a rollout whose 202 was lost
  with a dying gateway ends by itself, as ``lease_expired``), the record's final status and
  result; and one more poll after the run settled (with the trainer's lease token, through a
  gateway) answers that same terminal result — never another, never a non-terminal status;
* every record became terminal exactly once (its ``terminations`` count, kept by Redis);
* nothing is left queued, running or leased, and every record has a TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import redis

from rollout_core.settings import FleetSettings
from rollout_core.store.schema import Keys
from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from rollout_sdk.config.settings import RolloutClientSettings
from rollout_sdk.core.schemas import RolloutResponse
from tests.harness import REPO, MockTrainGateClient, new_id, v1_body, v2_body

Protocol = Literal["v1", "v2"]
LEASE_HEADER = "X-Osmosis-Rollout-Lease"
TERMINAL = {"success", "failure", "cancelled"}
FIGURES = REPO / "test-output" / "chaos"

# Fast recovery knobs (production ones are measured in tests/leases/test_worker_crash).
CHAOS_ENV = {
    "OSMOSIS_ROLLOUT_CLIENT_RETRY_BASE_DELAY": "0.2",
    "OSMOSIS_ROLLOUT_CLIENT_RETRY_MAX_DELAY": "1",
    "OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS": "2",
    "ROLLOUT_FLEET_LEASE_SECONDS": "3",
    "ROLLOUT_FLEET_SWEEP_INTERVAL_SECONDS": "1",
    "ROLLOUT_FLEET_RESULT_WAIT_TIMEOUT_SECONDS": "2",
    "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS": "15",
}


@dataclass
class ChaosFleet:
    """A fleet on a Redis of its own (AOF on, so it can be restarted)."""

    protocol: Protocol
    fleet: LocalFleet
    redis_server: RedisServer
    trainer: MockTrainGateClient

    @classmethod
    def start(
        cls,
        protocol: Protocol,
        agent: str,
        trainer: MockTrainGateClient,
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        **options: Any,
    ) -> ChaosFleet:
        redis_server = RedisServer(appendonly=True, data_dir=workdir / "redis").start()
        options = {"workers": 2, "concurrency": 40, "gateways": 2, **options}
        fleet = LocalFleet(
            agent=agent,
            redis_url=redis_server.url,
            env={**CHAOS_ENV, **(env or {})},
            log_dir=workdir / "logs",
            **options,
        )
        chaos = cls(protocol, fleet, redis_server, trainer)
        try:
            fleet.start()
        except BaseException:
            chaos.stop()
            raise
        return chaos

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_server.url, decode_responses=True)

    @property
    def queue(self) -> str:
        return self.fleet.env.get("ROLLOUT_FLEET_QUEUE", "rollouts")

    @property
    def keys(self) -> Keys:
        return Keys(self.fleet.key_prefix)

    def record_key(self, rollout_id: str) -> str:
        return self.keys.record(self.protocol, rollout_id)

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(
            f"--- {name} ---\n{process.output()[-tail:]}"
            for name, process in self.fleet.processes.items()
        )

    def held_by(self, name: str) -> list[str]:
        """The records leased to worker ``name``."""
        store, pid = self.redis(), self.fleet.processes[name].pid
        return [
            record
            for record in store.zrange(self.keys.leases, 0, -1)
            if f":{pid}:" in (store.hget(record, "execution") or "")
        ]

    def wait_taken_over(self, records: list[str], pid: int, timeout: float = 60) -> float:
        """Seconds until every one of ``records`` is run by another worker than ``pid``'s (or
        finished)."""
        store, started = self.redis(), time.monotonic()
        while time.monotonic() - started < timeout:
            states = [store.hmget(record, "status", "execution") for record in records]
            if all(s in TERMINAL or (o and f":{pid}:" not in o) for s, o in states):
                return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"the rollouts of worker {pid} were not taken over")

    def kill_worker(self, name: str) -> Crash:
        """``kill -9``, then what a supervisor (compose's restart policy) does; the crash as
        :func:`audit` needs it to excuse a repeat."""
        held = frozenset(self.held_by(name))
        self.fleet.processes[name].kill()
        crash = Crash(held=held, at=time.time())
        assert self.fleet.restart_dead_workers() == [name]
        return crash

    def restart_gateway(self, index: int) -> None:
        """Start gateway ``index`` (1 = the first) again on its port, once it died."""
        self.fleet.processes.pop("gateway" if index == 1 else f"gateway-{index}")
        self.fleet.start_gateway(index=index)

    def stop(self) -> None:
        self.fleet.stop()
        self.redis_server.stop()


def chaos_bodies(
    protocol: Protocol,
    trainer_url: str,
    count: int,
    *,
    seconds: tuple[float, float] = (0.5, 3.0),
    label: str = "chaos",
    **fields: Any,
) -> list[dict[str, Any]]:
    """``count`` scripted rollouts that each wait, chat once and wait again, lasting a random
    time in ``seconds`` — long enough for the scenario's fault to catch many mid-flight."""
    bodies = []
    for _ in range(count):
        before, after = (random.uniform(*seconds) / 2 for _ in range(2))
        rollout_id = new_id(label)
        if protocol == "v1":
            script = [{"sleep": before}, {"chat": {}}, {"sleep": after}, {"complete": {}}]
            bodies.append(v1_body(trainer_url, rollout_id, metadata={"script": script}, **fields))
        else:
            script = [{"sleep": before}, {"chat": {}}, {"sleep": after}]
            bodies.append(v2_body(trainer_url, rollout_id, metadata={"script": script}, **fields))
    return bodies


@dataclass
class Trainer:
    """A trainer offering rollouts from a thread of its own, the way a careful client would:
    v1 admissions retried (same idempotency key) on transport errors and 5xx; v2 admissions
    retried on 429 after ``Retry-After`` and, on a transport error, once on another gateway
    (a 409 then means the lost answer was a 202: its lease token is gone); v2 polls moved to
    another gateway on transport errors and 502/503/504."""

    protocol: Protocol
    gateways: list[str]
    bodies: list[dict[str, Any]]
    api_key: str | None = None
    concurrency: int = 64
    pace: float = 0.0  # seconds between admissions (0: all at once)
    admitted: set[str] = field(default_factory=set)
    orphaned: set[str] = field(default_factory=set)  # v2: admitted, 202 lost
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # v2 first terminal bodies
    tokens: dict[str, str] = field(default_factory=dict)  # v2 polling lease tokens
    rejections: Counter[int] = field(default_factory=Counter)  # 429s and other refusals seen
    errors: list[str] = field(default_factory=list)
    broken_connections: int = 0  # requests a dying gateway never answered
    stopping: bool = False  # set: v2 polls end (a trainer that gives up)
    _thread: threading.Thread | None = None

    def start(self) -> Trainer:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the trainer is still busy after {timeout}s"
        assert not self.errors, self.errors[:5]

    async def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.concurrency * 2)
        async with httpx.AsyncClient(timeout=30, headers=headers, limits=limits) as http:
            gate = asyncio.Semaphore(self.concurrency)

            async def one(index: int, body: dict[str, Any]) -> None:
                await asyncio.sleep(index * self.pace)
                async with gate:
                    try:
                        if self.protocol == "v1":
                            await self._v1(http, body)
                        else:
                            await self._v2(http, body)
                    except Exception as exc:
                        self.errors.append(f"{body['rollout_id']}: {type(exc).__name__}: {exc}")

            await asyncio.gather(*(one(i, body) for i, body in enumerate(self.bodies)))

    def _gateway(self, attempt: int) -> str:
        return self.gateways[attempt % len(self.gateways)]

    async def _v1(self, http: httpx.AsyncClient, body: dict[str, Any]) -> None:
        for attempt in range(60):
            try:
                response = await http.post(f"{self._gateway(attempt)}/v1/rollout/init", json=body)
            except httpx.TransportError:
                self.broken_connections += 1
                await asyncio.sleep(0.5)
                continue
            if response.status_code == 202:
                self.admitted.add(body["rollout_id"])
                return
            self.rejections[response.status_code] += 1
            if response.status_code not in (502, 503, 504):
                raise AssertionError(f"admission answered {response.status_code}: {response.text}")
            await asyncio.sleep(0.5)
        raise AssertionError("never admitted")

    async def _v2(self, http: httpx.AsyncClient, body: dict[str, Any]) -> None:
        rollout_id = body["rollout_id"]
        token = await self._admit_v2(http, body)
        if token is None:
            return
        attempt = 0
        while not self.stopping:
            url = f"{self._gateway(attempt)}/rollout/{rollout_id}/result"
            try:
                response = await http.get(url, headers={LEASE_HEADER: token})
            except httpx.TransportError:
                self.broken_connections += 1
                attempt += 1
                await asyncio.sleep(0.1)
                continue
            if response.status_code in (502, 503, 504):
                attempt += 1
                await asyncio.sleep(0.25)
                continue
            if response.status_code != 200:
                raise AssertionError(f"poll answered {response.status_code}: {response.text}")
            result: dict[str, Any] = response.json()
            if result["status"] in TERMINAL and await self._terminal(rollout_id, result):
                return

    async def _terminal(self, rollout_id: str, result: dict[str, Any]) -> bool:
        """A terminal poll: kept; whether polling ends (a subclass may poll again)."""
        self.results[rollout_id] = result
        return True

    async def _admit_v2(self, http: httpx.AsyncClient, body: dict[str, Any]) -> str | None:
        rollout_id = body["rollout_id"]
        lost_answer = False
        for attempt in range(600):
            try:
                response = await http.post(f"{self._gateway(attempt)}/rollout", json=body)
            except httpx.TransportError:
                self.broken_connections += 1
                lost_answer = True
                await asyncio.sleep(0.2)
                continue
            if response.status_code == 202:
                self.admitted.add(rollout_id)
                token: str = response.json()["polling_lease_token"]
                self.tokens[rollout_id] = token
                return token
            self.rejections[response.status_code] += 1
            if response.status_code == 409 and lost_answer:
                self.admitted.add(rollout_id)
                self.orphaned.add(rollout_id)
                return None
            if response.status_code == 429:
                retry_after = response.headers.get("Retry-After")
                if retry_after is None:
                    raise AssertionError("429 without Retry-After")
                await asyncio.sleep(float(retry_after))
                continue
            if response.status_code not in (502, 503, 504):
                raise AssertionError(f"admission answered {response.status_code}: {response.text}")
            await asyncio.sleep(0.5)
        raise AssertionError("never admitted")


@dataclass(frozen=True)
class Crash:
    """A worker killed at ``at`` (wall clock, as the mock trainer notes arrivals) while it
    held the records ``held``."""

    held: frozenset[str]
    at: float


@dataclass(frozen=True)
class Outcome:
    """What a scenario's audit found (and what RELIABILITY.md reports)."""

    offered: int
    admitted: int
    completed: int  # terminal success
    failed: int  # terminal failure/cancelled (a clear error state, not lost)
    duplicates: int  # records made terminal more than once, or callbacks beyond the first
    contradictions: int  # rollouts whose callback or terminal poll the final record belies
    excused: int  # repeated v1 callbacks a kill in the first window explains (see module)
    lost: int  # admitted but never terminal
    reruns: int  # rollouts a worker started again after another's execution was lost
    statuses: dict[str, int]


# How far a crash may precede the arrival of the callback it repeats: ``Crash.at`` is read
# after the kill returned, and a request the worker had written whole still reaches the
# trainer from the kernel's buffers after its process died.
REPEAT_SLACK = 1.0


@dataclass(frozen=True)
class Timings:
    """The recovery timings a fleet runs with, read from the environment its processes get
    (a setting it leaves unset has its settings model's default)."""

    lease: float  # ROLLOUT_FLEET_LEASE_SECONDS
    sweep: float  # ROLLOUT_FLEET_SWEEP_INTERVAL_SECONDS
    client_timeout: float  # OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS: one callback attempt
    callback_retries: int  # OSMOSIS_ROLLOUT_CLIENT_COMPLETE_ROLLOUT_RETRIES
    retry_base_delay: float  # OSMOSIS_ROLLOUT_CLIENT_RETRY_BASE_DELAY
    retry_max_delay: float  # OSMOSIS_ROLLOUT_CLIENT_RETRY_MAX_DELAY

    @classmethod
    def of(cls, env: Mapping[str, str]) -> Timings:
        def fleet(name: str) -> float:
            return _setting(env, FleetSettings, name)

        def client(name: str) -> float:
            return _setting(env, RolloutClientSettings, name)

        return cls(
            lease=fleet("lease_seconds"),
            sweep=fleet("sweep_interval_seconds"),
            client_timeout=client("timeout_seconds"),
            callback_retries=int(client("complete_rollout_retries")),
            retry_base_delay=client("retry_base_delay"),
            retry_max_delay=client("retry_max_delay"),
        )

    @classmethod
    def of_fleet(cls, chaos: ChaosFleet) -> Timings:
        return cls.of({**chaos.fleet.process_env(), **chaos.fleet.env})

    @property
    def repeat_window(self) -> float:
        """How long after a callback's arrival the crash that makes it repeat may come: the
        worker that posted it records the trainer's answer as it arrives, and waits for it at
        most the client timeout; a second more for the loop and the Redis write."""
        return self.client_timeout + REPEAT_SLACK

    @property
    def settle(self) -> float:
        """How long the audit waits, once every record ended and every v1 rollout was called
        back, before it reads callbacks, polls and records. A takeover (and the repeat it
        posts) comes before its record ends: the record ends only once the taking-over
        execution recorded the trainer's answer, and nothing takes an ended rollout over. So
        what can still arrive is an attempt under way as the record ended — one whose lease
        was checked just before its body went out (a stale execution's; the check refuses it
        after): its body and the trainer's answer take at most the client timeout, and a
        second more for the loop. A record does not change once ended."""
        return self.client_timeout + 2 * REPEAT_SLACK


def _setting(env: Mapping[str, str], model: Any, name: str) -> float:
    """Setting ``name`` of the pydantic-settings ``model`` as ``env`` sets it, else its
    default."""
    value = env.get(f"{model.model_config.get('env_prefix', '')}{name}".upper())
    return float(value) if value else float(model.model_fields[name].default)


def settle_seconds(chaos: ChaosFleet) -> float:
    """How long after every record ended the audit waits before it judges
    (:attr:`Timings.settle` of the fleet's timings)."""
    return Timings.of_fleet(chaos).settle


def audit(
    chaos: ChaosFleet,
    trainer: Trainer,
    timeout: float = 120,
    undeliverable: frozenset[str] | set[str] = frozenset(),
    crashes: list[Crash] | None = None,
) -> Outcome:
    """Wait for the trainer and the fleet to settle, then check the promise (see module).
    ``undeliverable``: v1 rollouts whose trainer refuses every callback (none may arrive);
    ``crashes``: the workers killed, which may excuse a v1 repeat."""
    outcome, problems = judge(chaos, trainer, timeout, undeliverable, crashes)
    found = (outcome.lost, outcome.duplicates, outcome.contradictions)
    assert found == (0, 0, 0), f"{outcome}\n{problems[:20]}\n{chaos.logs()}"
    _assert_settled(chaos, chaos.redis())
    return outcome


def judge(
    chaos: ChaosFleet,
    trainer: Trainer,
    timeout: float = 120,
    undeliverable: frozenset[str] | set[str] = frozenset(),
    crashes: list[Crash] | None = None,
) -> tuple[Outcome, list[str]]:
    """What :func:`audit` checks, found rather than asserted: the outcome, and a line for each
    rollout whose result was lost, repeated or contradicted."""
    trainer.join(timeout)
    store = chaos.redis()
    records = {rollout_id: chaos.record_key(rollout_id) for rollout_id in trainer.admitted}
    _wait_terminal(chaos, store, records, timeout)
    deliverable = trainer.admitted - undeliverable
    if chaos.protocol == "v1":
        _wait_delivered(chaos, deliverable, timeout)
    timings = Timings.of_fleet(chaos)
    time.sleep(timings.settle)
    # v2: every rollout polled once more, as its trainer would, before the records are read.
    polls = _final_polls(chaos, trainer) if chaos.protocol == "v2" else {}
    finals = {rollout_id: store.hgetall(record) for rollout_id, record in records.items()}
    problems = [f"{i}: {f.get('status', 'missing')}" for i, f in finals.items() if not _ended(f)]
    duplicates = sum(1 for fields in finals.values() if int(fields.get("terminations", 0)) > 1)
    excused = 0
    if chaos.protocol == "v1":
        deliveries = chaos.trainer.deliveries()
        assert not undeliverable & deliveries.keys()
        calls = {i: deliveries.get(i, []) for i in deliverable}
        if any(len(delivered) > 1 for delivered in calls.values()):
            unexcused, excused = judge_repeats(
                calls, _arrivals(chaos), records, crashes or [], timings.repeat_window
            )
            duplicates += unexcused
            problems += [f"{i}: {len(c)} callbacks" for i, c in calls.items() if len(c) > 1]
        contradicting = _contradicting_callbacks(calls, finals)
        completed = sum(1 for c in calls.values() if c and c[0]["status"] == "COMPLETED")
    else:
        assert trainer.results.keys() == trainer.admitted - trainer.orphaned
        assert trainer.tokens.keys() == trainer.results.keys()
        contradicting = _contradicting_polls(trainer.results, polls, finals)
        completed = sum(1 for fields in finals.values() if fields.get("status") == "success")
    outcome = Outcome(
        offered=len(trainer.bodies),
        admitted=len(trainer.admitted),
        completed=completed,
        failed=len(trainer.admitted) - completed,
        duplicates=duplicates,
        contradictions=len(contradicting),
        excused=excused,
        lost=sum(1 for fields in finals.values() if not _ended(fields)),
        reruns=sum(1 for fields in finals.values() if int(fields.get("attempt", 0)) > 1),
        statuses=dict(Counter(fields.get("status", "missing") for fields in finals.values())),
    )
    return outcome, problems + contradicting


def _ended(fields: dict[str, str]) -> bool:
    return fields.get("status") in TERMINAL and fields.get("terminations") == "1"


def _stored_result(fields: dict[str, str]) -> Any:
    """A record's result as the trainer reads it (JSON), else its text."""
    text = fields.get("result") or "null"
    with contextlib.suppress(ValueError):
        return json.loads(text)
    return text


def _contradicting_callbacks(
    calls: dict[str, list[dict[str, Any]]], finals: dict[str, dict[str, str]]
) -> list[str]:
    """A line for each v1 rollout whose callbacks the final record belies: a body other than
    its stored result (as the trainer reads it), or COMPLETED for a record that is not
    ``success`` (or the other way round)."""
    found = []
    for rollout_id, delivered in calls.items():
        fields = finals[rollout_id]
        status, stored = fields.get("status"), fields.get("result") or ""
        try:
            result = RolloutResponse.model_validate_json(stored).model_dump(
                mode="json", exclude_none=True
            )
        except ValueError:
            result = None
        said = [call.get("status") for call in delivered]
        if any(call != result for call in delivered):
            found.append(f"{rollout_id}: called back {said}, the record ({status}) stores another")
        elif any((s == "COMPLETED") != (status == "success") for s in said):
            found.append(f"{rollout_id}: called back {said}, the record says {status}")
    return found


def _contradicting_polls(
    results: dict[str, dict[str, Any]],
    polls: dict[str, dict[str, Any] | None],
    finals: dict[str, dict[str, str]],
) -> list[str]:
    """A line for each v2 rollout whose polls disagree: its first terminal poll (``results``)
    or the poll after the run settled (``polls``: ``None`` if no gateway answered it) is not
    the record's final status and result, the two differ, or the later one is not terminal
    (a status regression, or an answer other than a 200)."""
    found = []
    for rollout_id in sorted(results.keys() | polls.keys()):
        fields = finals[rollout_id]
        status, stored = fields.get("status"), _stored_result(fields)
        first = results.get(rollout_id)
        said: list[str] = []
        if first is not None and (first.get("status") != status or first != stored):
            said.append(f"polled {first.get('status')}")
        if rollout_id in polls:
            later = polls[rollout_id]
            if later is None:
                said.append("no gateway answered its poll after the run")
            elif later.get("status") not in TERMINAL:
                said.append(f"polled {later.get('status')} after a terminal poll")
            elif first is not None and later != first:
                said.append(f"polled {later.get('status')} after the run, another result")
            elif later.get("status") != status or later != stored:
                said.append(f"polled {later.get('status')} after the run")
        if said:
            found.append(
                f"{rollout_id}: {'; '.join(said)}, the record says "
                f"{status}: {str(fields.get('result'))[:200]}"
            )
    return found


def poll_once(
    gateways: list[str], rollout_id: str, token: str, api_key: str | None = None
) -> dict[str, Any] | None:
    """One more poll of a v2 rollout (an audit's, at the end): its body, or for any other
    answer than a 200 (a 409, 403, 404: every poll must return the terminal result) a body
    saying what came instead, which no result equals; ``None`` only if no gateway answered."""
    headers = {LEASE_HEADER: token}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for attempt in range(10):
        url = f"{gateways[attempt % len(gateways)]}/rollout/{rollout_id}/result"
        try:
            response = httpx.get(url, headers=headers, timeout=10)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if response.status_code in (502, 503, 504):
            time.sleep(0.2)
            continue
        if response.status_code != 200:
            return {"status": f"answered {response.status_code}", "body": response.text[:200]}
        result: dict[str, Any] = response.json()
        return result
    return None


def _final_polls(chaos: ChaosFleet, trainer: Trainer) -> dict[str, dict[str, Any] | None]:
    """One more poll of every v2 rollout whose polling lease token the trainer holds, through
    the fleet's gateways, after the run settled."""
    held = sorted(trainer.tokens.items())
    gateways = chaos.fleet.gateway_urls

    def poll(one: tuple[str, str]) -> dict[str, Any] | None:
        return poll_once(gateways, *one, api_key=trainer.api_key)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(poll, held))
    return {rollout_id: answer for (rollout_id, _), answer in zip(held, answers, strict=True)}


def _wait_terminal(
    chaos: ChaosFleet, store: redis.Redis, records: dict[str, str], timeout: float
) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        statuses = {
            record: store.hget(record, "status") or "missing" for record in records.values()
        }
        if all(status in TERMINAL for status in statuses.values()):
            return statuses
        if time.monotonic() > deadline:
            stuck = Counter(s for s in statuses.values() if s not in TERMINAL)
            raise AssertionError(f"rollouts never finished: {stuck}\n{chaos.logs()}")
        time.sleep(0.2)


def _wait_delivered(
    chaos: ChaosFleet, admitted: set[str], timeout: float
) -> dict[str, list[dict[str, Any]]]:
    deadline = time.monotonic() + timeout
    while True:
        deliveries = chaos.trainer.deliveries()
        if admitted <= deliveries.keys():
            return deliveries
        if time.monotonic() > deadline:
            missing = admitted - deliveries.keys()
            raise AssertionError(f"{len(missing)} rollouts never called back\n{chaos.logs()}")
        time.sleep(0.2)


def judge_repeats(
    deliveries: dict[str, list[dict[str, Any]]],
    arrivals: dict[str, list[float]],
    records: dict[str, str],
    crashes: list[Crash],
    window: float,
) -> tuple[int, int]:
    """The repeated v1 callbacks as (unexcused, excused). A repeat is excused only if it is
    byte-identical to the first callback and a crash of its own explains it (one crash
    excuses one repeat of a rollout): the callback before it went out from a worker that was
    killed before recording the trainer's answer, so a kill of a worker holding the rollout
    (``crash.held``: the records leased to it as it was killed) from ``REPEAT_SLACK`` before
    that callback's arrival to ``window`` after it (:attr:`Timings.repeat_window`). The first
    repeat needs a kill around the first callback's arrival, the second one around the
    second's (the worker that took the rollout over and posted it again), and so on."""
    unexcused = excused = 0
    for rollout_id, calls in deliveries.items():
        repeats = len(calls) - 1
        if repeats < 1:
            continue
        if any(call != calls[0] for call in calls):
            unexcused += repeats
            continue
        record = records[rollout_id]
        holders = sorted((c for c in crashes if record in c.held), key=lambda c: c.at)
        used: list[Crash] = []
        for at in sorted(arrivals.get(rollout_id, []))[:repeats]:
            crash = next(
                (c for c in holders if c not in used and at - REPEAT_SLACK <= c.at <= at + window),
                None,
            )
            if crash is not None:
                used.append(crash)
        excused += len(used)
        unexcused += repeats - len(used)
    return unexcused, excused


def _arrivals(chaos: ChaosFleet) -> dict[str, list[float]]:
    """When each callback of each rollout reached the mock trainer (wall clock), in order."""
    answer = chaos.trainer.http.get(f"{chaos.trainer.url}/mock/completed")
    answer.raise_for_status()
    arrivals: dict[str, list[float]] = {}
    for rollout_id, at in answer.json()["completed"]:
        arrivals.setdefault(rollout_id, []).append(at)
    return arrivals


def _assert_settled(chaos: ChaosFleet, store: redis.Redis) -> None:
    assert store.zcard(chaos.keys.active) == 0
    assert store.zcard(chaos.keys.leases) == 0
    records = store.scan_iter(f"{chaos.keys.records_of(chaos.protocol)}*", count=1000)
    without_ttl = [key for key in records if store.pttl(key) < 0]
    assert without_ttl == [], f"records without a TTL: {without_ttl[:10]}"


def record_figures(
    scenario: str, protocol: Protocol, outcome: Outcome | None, **extra: Any
) -> None:
    """Keep a scenario's figures for RELIABILITY.md (``test-output/chaos/``)."""
    FIGURES.mkdir(parents=True, exist_ok=True)
    counts = outcome.__dict__ if outcome is not None else {}
    figures = {"scenario": scenario, "protocol": protocol, **counts, **extra}
    (FIGURES / f"{scenario}-{protocol}.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))
