"""Nothing ``rollout-fleet up`` starts outlives it, however it ends: Ctrl-C, SIGTERM, a
crash, SIGKILL, the OOM killer.

Before it starts anything, ``up`` starts this reaper (``python -m rollout_fleet.reaper``) as
the leader of a new process group, with a pipe from ``up`` as its stdin. Every process of the
fleet is started in that group, and their own children are born in it (a gateway's uvicorn
workers, a Redis fork): the group is the fleet, whatever ``up`` knew of it, and no other
process can take its number while the reaper lives. It is not the terminal's foreground
group, so Ctrl-C and a closing terminal reach ``up`` alone. When the pipe closes (``up``
exited, or died: the kernel closes it either way) the reaper SIGKILLs every other process of
its group, removes ``up``'s state file and exits. After a clean stop nothing is left to kill.

The group's members are read from ``/proc/<pid>/stat`` (Linux); elsewhere the reaper kills
the whole group, itself included, without counting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Container
from pathlib import Path

REAP_SECONDS = 10.0  # at most this long killing (a dying parent may just have forked)


def members(group: int, spare: Container[int]) -> list[int]:
    """The live processes of process group ``group`` (a zombie is dead already)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spare:
            continue
        try:
            stat = Path("/proc", name, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # After the command name (in parentheses, and it may hold any character): the state,
        # the parent's pid, the process group.
        state, _, pgid = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgid) == group and state not in ("Z", "X"):
            found.append(int(name))
    return found


def reap(group: int, spare: Container[int]) -> int:
    """SIGKILL every live process of ``group`` until none is left; how many there were."""
    if not Path("/proc").is_dir():  # not Linux: the whole group at once, this reaper too
        os.killpg(group, signal.SIGKILL)
    killed: set[int] = set()
    deadline = time.monotonic() + REAP_SECONDS
    while (pids := members(group, spare)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(pids)
        time.sleep(0.05)
    return len(killed)


class Reaper:
    """``up``'s handle on its reaper: :meth:`start` it first, start the fleet's processes in
    its :attr:`group`, :meth:`close` it last."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @classmethod
    def start(cls, state_file: Path) -> Reaper:
        process = subprocess.Popen(
            [sys.executable, "-m", "rollout_fleet.reaper", str(state_file)],
            stdin=subprocess.PIPE,
            process_group=0,  # a group of its own: the fleet's
        )
        return cls(process)

    @property
    def group(self) -> int:
        """The process group the fleet's processes join (the reaper leads it)."""
        return self._process.pid

    def close(self) -> None:
        """``up`` is done: the reaper kills what is left of the fleet (after a clean stop,
        nothing) and exits."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(REAP_SECONDS + 5)


def main(state_file: Path) -> None:
    """Wait for ``up`` to end (its pipe closes), then kill what it left."""
    for meant_for_up in (signal.SIGINT, signal.SIGHUP):  # Ctrl-C, a closed terminal
        signal.signal(meant_for_up, signal.SIG_IGN)
    sys.stdin.buffer.read()  # ``up`` never writes: this returns once it has exited
    state_file.unlink(missing_ok=True)  # no one must look for a fleet that is gone
    killed = reap(os.getpgrp(), spare={os.getpid()})
    if killed:
        with contextlib.suppress(OSError):  # the terminal may be gone
            print(f"rollout-fleet up ended: killed {killed} processes it left", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
