"""``rollout-fleet eval run``: an evaluation's work items as rollouts of a fleet.

Each item goes through a gateway exactly as a trainer's rollout would: v1 as
``POST /v1/rollout/init`` whose ``server_url`` is this machine's bridge (it takes the LLM calls
and the completion callback), v2 as ``POST /rollout`` whose ``chat_completions_url`` is the
bridge, then polled to its result. The fleet is, in this order: the gateway ``--fleet URL``
or ``[fleet] gateway_url`` names; a ``rollout-fleet up`` running on this machine for the same
agent (found through :mod:`rollout_fleet.state`: a warm run starts nothing); else one started
for the run as ``up`` starts one (its own redis-server, no Flower), and stopped after it
(killed at once when the run is stopped: what it was doing is thrown away).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from rollout_fleet import state
from rollout_fleet.local import LocalFleet
from rollout_fleet.reaper import Reaper
from rollout_fleet.redis_server import RedisServer
from rollout_fleet.up import START_TIMEOUT_SECONDS
from rollout_sdk.client import RolloutClient
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.core.schemas import InitResponse, RolloutRequest, RolloutResponse
from rollout_sdk.core.schemas import RolloutStatus as V1Status
from rollout_sdk.evaluation.config import EvalConfig
from rollout_sdk.evaluation.run import EvalError, Job
from rollout_sdk.loader import Agent
from rollout_sdk.localrun.bridge import http_failure
from rollout_sdk.localrun.runner import (
    MAX_TOKENS_TOTAL,
    RowResult,
    RunOptions,
    settle,
    v2_row_result,
)

# Jobs at once per worker slot of a fleet started for the run (its default concurrency).
DEFAULT_WORKER_SLOTS = 32
EXTERNAL_FLEET_IN_FLIGHT = 64
# The longest a v1 rollout's callback is waited for: the fleet ends every rollout with one
# (timed out, if need be), so this only guards against a fleet that went away.
CALLBACK_WAIT_SECONDS = 3600.0
ADMISSION_ERROR = "admission_error"
NEW_FLEET = "new"  # --fleet new: start a fleet for the run even when an ``up`` runs


class FleetStartFailed(EvalError):
    """The fleet started for the run did not come up; the message says why."""


def _agent_key(reference: str, cwd: Path) -> str:
    """An agent reference as a comparable string: a file's path made absolute from ``cwd``."""
    target, colon, attribute = reference.partition(":")
    if target.endswith(".py") or "/" in target:
        target = str((cwd / target).resolve())
    return f"{target}{colon}{attribute}"


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if int(parent) == pid:
            children.append(int(entry.name))
    return children


def agent_of(fleet: state.UpFleet) -> str | None:
    """The agent a running ``up`` serves, as :func:`_agent_key` writes it: read from its
    processes' ``AGENT`` (Linux; ``None`` where it cannot be read)."""
    for child in _children_of(fleet.pid) if Path("/proc").is_dir() else []:
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            cwd = Path(os.readlink(f"/proc/{child}/cwd"))
        except OSError:
            continue
        for variable in environ:
            if variable.startswith(b"AGENT="):
                return _agent_key(variable.removeprefix(b"AGENT=").decode(), cwd)
    return None


def running_up_for(agent: str) -> state.UpFleet | None:
    """The newest ``rollout-fleet up`` running here for ``agent``, if any."""
    wanted = _agent_key(agent, Path.cwd())
    return next((fleet for fleet in state.running() if agent_of(fleet) == wanted), None)


async def in_daemon_thread[T](work: Callable[[], T]) -> T:
    """``work()`` in a thread of its own that never holds the process up: a run stopped while
    a fleet starts must not wait for the start to finish (the default executor's threads are
    waited for at exit)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle_with(outcome: Callable[[], None]) -> None:
        if not done.cancelled():
            outcome()

    def body() -> None:
        try:
            value = work()
        except BaseException as exc:  # handed to the awaiting task
            error = exc
            loop.call_soon_threadsafe(settle_with, lambda: done.set_exception(error))
        else:
            loop.call_soon_threadsafe(settle_with, lambda: done.set_result(value))

    threading.Thread(target=body, name="fleet-start", daemon=True).start()
    return await done


@dataclass
class FleetExecutor:
    agent: Agent
    config: EvalConfig
    options: RunOptions
    fleet: LocalFleet | None = field(default=None, init=False)
    _redis_server: RedisServer | None = field(default=None, init=False)
    _reaper: Reaper | None = field(default=None, init=False)
    _http: httpx.AsyncClient | None = field(default=None, init=False)
    _client: RolloutClient | None = field(default=None, init=False)
    _url: str = field(default="", init=False)
    _where: str = field(default="", init=False)

    @property
    def default_in_flight(self) -> int:
        if self.fleet is None:
            return EXTERNAL_FLEET_IN_FLIGHT
        target = self.config.fleet
        return target.workers * (target.concurrency or DEFAULT_WORKER_SLOTS)

    @property
    def where(self) -> str:
        return self._where

    async def __aenter__(self) -> Self:
        target = self.config.fleet
        key = os.environ.get(target.api_key_env) if target.api_key_env else None
        reused = None
        if target.gateway_url not in (None, NEW_FLEET):
            self._url = str(target.gateway_url).rstrip("/")
            self._where = f"on the fleet at {self._url}"
        elif target.gateway_url is None:
            reused = await asyncio.to_thread(running_up_for, self.config.agent)
        if reused is not None:
            self._url = reused.gateway_url.rstrip("/")
            self._where = f"on the fleet of rollout-fleet up (pid {reused.pid}) at {self._url}"
        elif not self._url:
            try:
                self._url = await in_daemon_thread(self._start_fleet)
            except asyncio.CancelledError:
                await asyncio.to_thread(self._kill_fleet)
                raise
            except (TimeoutError, RuntimeError, OSError) as exc:
                await asyncio.to_thread(self._kill_fleet)
                raise FleetStartFailed(f"the fleet did not start: {exc}") from None
            self._where = f"on a fleet started for the run at {self._url}"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60.0))
        self._client = RolloutClient(url=self._url, http_client=self._http, api_key=key)
        return self

    def _start_fleet(self) -> str:
        """A fleet as ``up`` starts one: in the process group of a reaper, so none of it
        outlives this run however it ends (a SIGKILLed run left its whole fleet running)."""
        self._reaper = Reaper.start(Path(tempfile.mkdtemp(prefix="rollout-eval-")) / "fleet")
        group = self._reaper.group
        self._redis_server = RedisServer(process_group=group).start()
        target = self.config.fleet
        self.fleet = LocalFleet(
            agent=self.config.agent,
            redis_url=self._redis_server.url,
            workers=target.workers,
            concurrency=target.concurrency,
            process_group=group,
        )
        # A child that exits (ChildExited) or a timeout: the caller says so. As long as `up`
        # waits: a sandboxed agent's gateway imports Harbor, slow on a loaded machine.
        self.fleet.start(START_TIMEOUT_SECONDS)
        return self.fleet.gateway_url

    def _stop_fleet(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        if self._redis_server is not None:
            self._redis_server.stop()
        self._kill_fleet()

    def _kill_fleet(self) -> None:
        """Every process of the fleet started for the run SIGKILLed at once: its process
        group, reaper included (after :meth:`_stop_fleet`'s clean stop, only the reaper)."""
        if self._reaper is not None:
            with contextlib.suppress(ProcessLookupError):  # the reaper leads the group
                os.killpg(self._reaper.group, signal.SIGKILL)
            self._reaper.close()
            self._reaper = None

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        # Stopped or failed, the run throws the fleet's work away: no clean stop to wait for.
        await asyncio.to_thread(self._stop_fleet if kind is None else self._kill_fleet)

    async def run(self, job: Job) -> RowResult:
        started = time.monotonic()
        try:
            if isinstance(self.agent, RolloutAgentLoop):
                result = await self._run_v1(job)
            else:
                result = await self._run_v2(job)
        except httpx.HTTPError as exc:  # the gateway went away: this item fails, not the run
            result = self._result(
                job,
                success=False,
                status="ERROR",
                error=f"the gateway {self._url} is unreachable: {http_failure(exc)}",
                error_category=ADMISSION_ERROR,
            )
        return settle(result, job.bridge.usage_of(job.rollout_id), started)

    def _result(self, job: Job, **fields: Any) -> RowResult:
        return RowResult(row_index=job.row.index, rollout_id=job.rollout_id, **fields)

    async def _run_v1(self, job: Job) -> RowResult:
        assert self._http is not None
        request = RolloutRequest(
            rollout_id=job.rollout_id,
            server_url=job.bridge.url,
            messages=job.row.messages,
            completion_params=dict(self.options.completion_params),
            max_turns=self.options.max_turns,
            max_tokens_total=MAX_TOKENS_TOTAL,
            api_key=job.bridge.key,  # the bridge's: the model endpoint's own stays here
            metadata={
                "ground_truth": job.row.ground_truth,
                **job.row.extra,
                **job.metadata,
                "execution_mode": "eval",
            },
        )
        callback = job.bridge.completion_of(job.rollout_id)
        answer = await self._http.post(
            f"{self._url}/v1/rollout/init",
            content=request.model_dump_json(exclude_none=True),
            headers={"Content-Type": "application/json"},
        )
        if answer.status_code not in (200, 202):
            return self._refused(job, answer)
        tools = InitResponse.model_validate_json(answer.content).tools
        job.bridge.tools[job.rollout_id] = [t.model_dump(exclude_none=True) for t in tools]
        try:
            response: RolloutResponse = await asyncio.wait_for(callback, CALLBACK_WAIT_SECONDS)
        except TimeoutError:
            return self._result(
                job,
                success=False,
                status="ERROR",
                error="no completion callback came",
                error_category="timeout",
            )
        succeeded = response.status is V1Status.COMPLETED
        return self._result(
            job,
            success=succeeded,
            status=response.status.value,
            reward=response.reward,
            error=response.error_message,
            error_category=None if succeeded else "agent_error",
            finish_reason=response.finish_reason,
            messages=list(response.final_messages),
        )

    async def _run_v2(self, job: Job) -> RowResult:
        assert self._client is not None
        try:
            handle = await self._client.run_rollout_async(
                initial_messages=[dict(message) for message in job.row.messages],
                chat_completions_url=f"{job.bridge.url}/v1/rollouts/{job.rollout_id}",
                rollout_id=job.rollout_id,
                llm_api_key=job.bridge.key,  # the bridge's: the model endpoint's own stays here
                label=job.row.ground_truth,
                metadata={**(job.row.metadata or job.row.extra), **job.metadata},
                agent_timeout_sec=self.options.agent_timeout_s,
                grader_timeout_sec=self.options.grader_timeout_s,
            )
        except Exception as exc:  # refused or unreachable: this item fails, the run goes on
            return self._result(
                job, success=False, status="ERROR", error=str(exc), error_category=ADMISSION_ERROR
            )
        try:
            return v2_row_result(job.row.index, job.rollout_id, await handle)
        finally:
            handle.cancel()  # polls in a task of its own: it must not outlive this job

    def _refused(self, job: Job, answer: httpx.Response) -> RowResult:
        return self._result(
            job,
            success=False,
            status="ERROR",
            error=f"the gateway answered {answer.status_code}: {answer.text[:300]}",
            error_category=ADMISSION_ERROR,
        )


__all__ = ["NEW_FLEET", "FleetExecutor", "FleetStartFailed", "agent_of", "running_up_for"]
