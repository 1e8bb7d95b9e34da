"""The agent's ``get_tools()`` on threads of its own, counting the calls that hang.

A thread cannot be stopped: a ``get_tools`` that hangs keeps its thread after the admission
gave up on it (``ROLLOUT_FLEET_GET_TOOLS_TIMEOUT_SECONDS``). Once hung calls hold every thread
(``ROLLOUT_FLEET_GET_TOOLS_THREADS``), an admission is refused at once with 503 and a reason
instead of queueing behind them and timing out as a misleading 500, and ``/ready`` says the
gateway is not ready, so an orchestrator restarts it. Calls that are merely many (a trainer's
burst of admissions) wait for a thread: only a call past its timeout counts as hung (counting
every call in flight refused 288 of a 256-at-once v1 benchmark's admissions with 503).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from fastapi import HTTPException

from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.core.schemas import RolloutRequest
from rollout_sdk.runner import PreparedRollout, ToolsError, prepare_rollout

RETRY_AFTER_SECONDS = 5


class _Call:
    """One get_tools call: whether it returned, and whether its admission gave up on it."""

    __slots__ = ("hung", "returned")

    def __init__(self) -> None:
        self.hung = False
        self.returned = False


class ToolsRunner:
    def __init__(self, threads: int, timeout_seconds: float) -> None:
        self.threads = threads
        self.timeout_seconds = timeout_seconds
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="get-tools")
        self._lock = threading.Lock()
        self._hung = 0  # calls past their timeout that have not returned

    @property
    def exhausted(self) -> bool:
        """Every thread is held by a hung call."""
        with self._lock:
            return self._hung >= self.threads

    def refusal(self) -> str:
        return (
            f"all {self.threads} get_tools() threads are held by calls that have not returned "
            f"(each admission waits {self.timeout_seconds:g}s for its own; "
            "ROLLOUT_FLEET_GET_TOOLS_THREADS); retry later"
        )

    async def prepare(
        self, agent_loop: RolloutAgentLoop, request: RolloutRequest
    ) -> PreparedRollout:
        """``get_tools`` for one admission; a raise or a hang is a ``ToolsError``, a gateway
        whose threads are all held answers 503."""
        if self.exhausted:
            raise HTTPException(
                503, self.refusal(), headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            )
        call = _Call()
        future = asyncio.get_running_loop().run_in_executor(
            self._pool, self._run, call, agent_loop, request
        )
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_seconds)
        except TimeoutError:
            with self._lock:
                if not call.returned:
                    call.hung = True
                    self._hung += 1
            raise ToolsError(
                f"get_tools() did not return within {self.timeout_seconds:g}s"
            ) from None

    def _run(
        self, call: _Call, agent_loop: RolloutAgentLoop, request: RolloutRequest
    ) -> PreparedRollout:
        try:
            return prepare_rollout(agent_loop, request)
        finally:
            with self._lock:
                call.returned = True
                if call.hung:
                    self._hung -= 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ToolsRunner"]
