"""A sampling profiler for a process of the fleet: a thread that looks at every other
thread's stack every few milliseconds and counts, for each sample where the thread was busy,
the function it was in (self time) and the code areas on its stack (inclusive time). Counts
are written to a JSON file every two seconds and at exit; ``bench/profile.py`` reads them.

A thread is idle when its innermost Python frame is a wait (the event loop's poll, a lock, a
sleep; the worker's loop thread inside uvloop's C loop counts so too, waiting or doing its own
work): those samples are counted apart. A busy sample stands for one sampling period of
Python code running, about that much CPU.
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time
from collections import Counter
from types import FrameType

INTERVAL_SECONDS = 0.002
DUMP_SECONDS = 2.0
_IDLE = frozenset(
    {
        "select", "poll", "epoll", "wait", "sleep", "acquire", "run_forever", "_run_once",
        "run_until_complete", "accept", "recv", "read", "readline", "get", "join", "_worker",
        "_serve",  # the worker's loop thread inside uvloop's C loop: waiting, or its own work
    }
)  # fmt: skip

# Code areas, by the first of these that a frame's file path contains.
AREAS = (
    ("fleet", ("/rollout_worker/", "/rollout_core/", "/rollout_gateway/", "/rollout_fleet/")),
    ("sdk", ("/rollout_sdk/",)),
    ("agent", ("/examples/", "/tests/agents/", "/bench/agents/")),
    ("http client", ("/httpx/", "/httpcore/", "/h11/", "/anyio/", "/openai/")),
    ("redis client", ("/redis/", "/hiredis")),
    ("celery/kombu", ("/celery/", "/kombu/", "/billiard/", "/vine/")),
    ("pydantic/json", ("/pydantic", "/json/", "/orjson")),
    ("logging", ("/logging/",)),
    ("asyncio", ("/asyncio/", "/uvloop/")),
)


def area(filename: str) -> str:
    for name, marks in AREAS:
        if any(mark in filename for mark in marks):
            return name
    return "other"


class Sampler:
    def __init__(self, out: str) -> None:
        self.out = out
        self.self_time: Counter[str] = Counter()
        self.inclusive: Counter[str] = Counter()
        self.leaf_area: Counter[str] = Counter()
        self.own: Counter[str] = Counter()  # the innermost fleet or SDK function on the stack
        self.busy = 0
        self.idle = 0
        self.rounds = 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()
        atexit.register(self.dump)

    def _take(self, frame: FrameType) -> None:
        code = frame.f_code
        if code.co_name in _IDLE:
            self.idle += 1
            return
        self.busy += 1
        where = "/".join(code.co_filename.rsplit("/", 2)[-2:])
        self.self_time[f"{area(code.co_filename)}: {code.co_qualname} ({where})"] += 1
        self.leaf_area[area(code.co_filename)] += 1
        seen: set[str] = set()
        own: str | None = None
        current: FrameType | None = frame
        while current is not None:
            name = area(current.f_code.co_filename)
            seen.add(name)
            if own is None and name in ("fleet", "sdk"):
                where = "/".join(current.f_code.co_filename.rsplit("/", 2)[-2:])
                own = f"{current.f_code.co_qualname} ({where})"
            current = current.f_back
        self.own[own or "(no fleet or SDK frame)"] += 1
        for name in seen:
            self.inclusive[name] += 1

    def _run(self) -> None:
        me = threading.get_ident()
        last_dump = time.monotonic()
        while not self._stop.wait(INTERVAL_SECONDS):
            self.rounds += 1
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    self._take(frame)
            if time.monotonic() - last_dump > DUMP_SECONDS:
                self.dump()
                last_dump = time.monotonic()

    def dump(self) -> None:
        figures = {
            "rounds": self.rounds,
            "seconds": time.monotonic() - self.started,
            "busy": self.busy,
            "idle": self.idle,
            "self": dict(self.self_time),
            "inclusive": dict(self.inclusive),
            "leaf_area": dict(self.leaf_area),
            "own": dict(self.own),
        }
        with open(self.out, "w") as file:
            json.dump(figures, file)


# How often a running thread is made to offer the GIL: an in-process sampler only gets to
# look when the GIL changes hands, so with the default 5 ms it would mostly see threads at
# their blocking calls (which release it).
SWITCH_SECONDS = 0.0002


def start(out: str) -> Sampler:
    sys.setswitchinterval(SWITCH_SECONDS)
    sampler = Sampler(out)
    sampler.start()
    return sampler
