"""What the checker needs to see while a run goes on, besides the fleet's own records.

* :class:`PollingTrainer`: the chaos suite's trainer, keeping every terminal poll of a v2
  rollout (it polls once more after the first, a second later); with the lease tokens every
  chaos trainer keeps, the checker polls every rollout once more at the end; it can be told
  to stop.
* :class:`Holders`: which execution held each leased rollout, sampled from Redis every
  ``interval``: a finished record keeps no execution, and its ``worker`` names only the last
  claimant, so who held a rollout when its callback went out must be watched for.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from rollout_core.store.schema import Keys
from tests.chaos.harness import Trainer, poll_once
from tests.nemesis.stage import PREFIX, Stage

REPOLL_AFTER = 1.0  # seconds between a v2 rollout's first terminal poll and the next


@dataclass
class PollingTrainer(Trainer):
    polls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # terminal bodies

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, deadline: float) -> bool:
        """Until the trainer is done or ``deadline`` (monotonic) passes; whether it is done."""
        assert self._thread is not None
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def stop(self) -> None:
        self.stopping = True

    def unfinished(self) -> list[str]:
        """Admitted v2 rollouts without a terminal poll (all v1 ones end at admission)."""
        if self.protocol == "v1":
            return []
        return sorted(self.admitted - self.orphaned - self.results.keys())

    async def _terminal(self, rollout_id: str, result: dict[str, Any]) -> bool:
        """Every terminal poll is kept; the first is followed by one more, a second later."""
        polls = self.polls.setdefault(rollout_id, [])
        polls.append(result)
        self.results.setdefault(rollout_id, result)
        if len(polls) > 1:
            return True
        await asyncio.sleep(REPOLL_AFTER)
        return False


@dataclass(frozen=True)
class Held:
    at: float  # epoch seconds of the sample
    execution: str
    status: str

    @property
    def pid(self) -> int:
        """The worker process's pid (an execution is ``<host>:<pid>:<tag>:<tag>``)."""
        try:
            return int(self.execution.split(":")[-3])
        except (IndexError, ValueError):
            return 0


@dataclass
class Holders:
    """Samples ``(execution, status)`` of every leased record of both fleets; keeps each
    record's changes. Survives Redis restarts and failovers (it reconnects to the primary)."""

    stage: Stage
    interval: float = 0.2
    seen: dict[str, list[Held]] = field(default_factory=dict)  # record key → changes
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Holders:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        client: redis.Redis | None = None
        while not self._stop.wait(self.interval):
            try:
                client = client or self.stage.redis()
                self._sample(client)
            except Exception:  # Redis away (restart, failover): sample again once it is back
                if client is not None:
                    client.close()
                client = None

    def _sample(self, client: redis.Redis) -> None:
        for prefix in PREFIX.values():
            records: list[str] = client.zrange(Keys(prefix).leases, 0, -1)  # type: ignore[assignment]
            pipe = client.pipeline(transaction=False)
            for record in records:
                pipe.hmget(record, "execution", "status")
            now = time.time()
            for record, (execution, status) in zip(records, pipe.execute(), strict=True):
                if not execution:
                    continue
                changes = self.seen.setdefault(record, [])
                if not changes or (changes[-1].execution, changes[-1].status) != (
                    execution,
                    status,
                ):
                    changes.append(Held(now, execution, status or ""))
        self.samples += 1

    def around(self, record: str, at: float, before: float, after: float) -> set[Held]:
        """The executions that may have sent a callback arriving ``at``: the last one seen
        holding ``record`` before it, the first seen after it (within ``after``), and any seen
        delivering it at some time from ``before`` seconds before it to ``after`` after it
        (one stopped before its POST posts it after the takeover's)."""
        changes = self.seen.get(record, [])
        if not changes:  # never seen held (it ran and ended between two samples)
            return set()
        earlier = [held for held in changes if held.at <= at]
        later = [held for held in changes if at < held.at <= at + after]
        found = set(earlier[-1:]) | set(later[:1])
        ends = [held.at for held in changes[1:]] + [float("inf")]
        found |= {
            held
            for held, end in zip(changes, ends, strict=True)
            if held.status == "delivering" and held.at <= at + after and end >= at - before
        }
        return found


__all__ = ["Held", "Holders", "PollingTrainer", "poll_once"]
