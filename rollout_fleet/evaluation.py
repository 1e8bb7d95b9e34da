"""``rollout-fleet eval run``: an evaluation's work items as rollouts of a fleet.

Each item goes through a gateway exactly as a trainer's rollout would: v1 as
``POST /v1/rollout/init`` whose ``server_url`` is this machine's bridge (it takes the LLM calls
and the completion callback), v2 as ``POST /rollout`` whose ``chat_completions_url`` is the
bridge, then polled to its result. The fleet is the one ``[fleet] gateway_url`` names, or one
started for the run as ``rollout-fleet up`` starts one (its own redis-server, no Flower), and
stopped after it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from rollout_fleet.local import ChildExited, LocalFleet
from rollout_fleet.reaper import Reaper
from rollout_fleet.redis_server import RedisServer
from rollout_sdk.client import RolloutClient
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.core.schemas import InitResponse, RolloutRequest, RolloutResponse
from rollout_sdk.core.schemas import RolloutStatus as V1Status
from rollout_sdk.evaluation.config import EvalConfig
from rollout_sdk.evaluation.run import EvalError, Job
from rollout_sdk.loader import Agent
from rollout_sdk.localrun.runner import MAX_TOKENS_TOTAL, RowResult, RunOptions, v2_row_result

# Jobs at once per worker slot of a fleet started for the run (its default concurrency).
DEFAULT_WORKER_SLOTS = 32
EXTERNAL_FLEET_IN_FLIGHT = 64
# The longest a v1 rollout's callback is waited for: the fleet ends every rollout with one
# (timed out, if need be), so this only guards against a fleet that went away.
CALLBACK_WAIT_SECONDS = 3600.0
ADMISSION_ERROR = "admission_error"


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

    @property
    def bridge_host(self) -> str:
        return self.config.fleet.bridge_host

    @property
    def default_in_flight(self) -> int:
        target = self.config.fleet
        if target.gateway_url is not None:
            return EXTERNAL_FLEET_IN_FLIGHT
        return target.workers * (target.concurrency or DEFAULT_WORKER_SLOTS)

    async def __aenter__(self) -> Self:
        target = self.config.fleet
        key = os.environ.get(target.api_key_env) if target.api_key_env else None
        if target.gateway_url is not None:
            self._url = target.gateway_url.rstrip("/")
        else:
            self._url = await asyncio.to_thread(self._start_fleet)
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
        try:
            self.fleet.start()
        except (ChildExited, TimeoutError) as exc:  # one line, as rollout-fleet up says it
            self._stop_fleet()
            raise EvalError(f"the fleet did not start: {exc}") from None
        except BaseException:
            self._stop_fleet()
            raise
        return self.fleet.gateway_url

    def _stop_fleet(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        if self._redis_server is not None:
            self._redis_server.stop()
        if self._reaper is not None:
            self._reaper.close()

    async def __aexit__(self, *_: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        await asyncio.to_thread(self._stop_fleet)

    async def run(self, job: Job) -> RowResult:
        started = time.monotonic()
        if isinstance(self.agent, RolloutAgentLoop):
            result = await self._run_v1(job)
        else:
            result = await self._run_v2(job)
        result.duration_ms = round((time.monotonic() - started) * 1000, 1)
        usage = job.bridge.usage_of(job.rollout_id)
        result.llm_calls = usage.calls
        result.token_usage = usage.token_usage()
        return result

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
                label=job.row.ground_truth,
                metadata={**(job.row.metadata or job.row.extra), **job.metadata},
                agent_timeout_sec=self.options.agent_timeout_s,
                grader_timeout_sec=self.options.grader_timeout_s,
            )
        except Exception as exc:  # refused or unreachable: this item fails, the run goes on
            return self._result(
                job, success=False, status="ERROR", error=str(exc), error_category=ADMISSION_ERROR
            )
        return v2_row_result(job.row.index, job.rollout_id, await handle)

    def _refused(self, job: Job, answer: httpx.Response) -> RowResult:
        return self._result(
            job,
            success=False,
            status="ERROR",
            error=f"the gateway answered {answer.status_code}: {answer.text[:300]}",
            error_category=ADMISSION_ERROR,
        )


__all__ = ["FleetExecutor"]
