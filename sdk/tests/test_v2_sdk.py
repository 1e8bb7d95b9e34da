"""CONFORMANCE §Q items 128-137: the v2 SDK surface (S§2), with the real Strands and OpenAI
Agents packages talking to the mock TrainGate over HTTP."""

from __future__ import annotations

import asyncio
import math
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from rollout_sdk import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    ConcurrencyConfig,
    ExecutionRequest,
    Grader,
    GraderContext,
    LocalBackend,
    RolloutSample,
)
from rollout_sdk.backend.execution import WorkflowBundle, execute_rollout
from rollout_sdk.context import RolloutContext, SampleSource
from rollout_sdk.discovery import DiscoveryError, discover_workflow
from rollout_sdk.types import RolloutStatus

Serve = Callable[[Any], str]
pytestmark = pytest.mark.anyio


class FixedSource(SampleSource):
    def __init__(self, text: str) -> None:
        self.text = text

    async def get_sample(self, *args: Any) -> RolloutSample:
        return RolloutSample(messages=[{"role": "assistant", "content": self.text}])


def test_128_set_sample_source_twice_is_refused() -> None:
    ctx = RolloutContext(rollout_id="r")
    ctx.set_sample_source(FixedSource("a"))
    with pytest.raises(ValueError, match="already has a sample source"):
        ctx.set_sample_source(FixedSource("b"))


async def test_128_named_sources_are_each_graded() -> None:
    class TwoAgents(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
            rollout = _current()
            rollout.register_sample_source("alice", FixedSource("a"))
            with pytest.raises(ValueError, match="already registered"):
                rollout.register_sample_source("alice", FixedSource("again"))
            rollout.register_sample_source("bob", FixedSource("b"))

    seen: dict[str, Any] = {}

    class PerSample(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            seen.update(ctx.get_samples())
            for sample_id in ctx.samples:
                ctx.set_sample_reward(sample_id, 1.0 if sample_id == "alice" else 0.5)

    outcome = await execute_rollout(
        WorkflowBundle(TwoAgents, grader_cls=PerSample),
        ExecutionRequest(id="r", prompt=[], label="x"),
        RolloutContext(rollout_id="r"),
    )
    assert set(seen) == {"alice", "bob"}
    result = outcome.result
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.reward == 1.0
    assert result.samples["bob"].reward == 0.5


def _current() -> RolloutContext:
    from rollout_sdk.context import get_rollout_context

    ctx = get_rollout_context()
    assert ctx is not None
    return ctx


def test_129_reward_setters_fail_clearly() -> None:
    with pytest.raises(ValueError, match=r"^Sample missing not found$"):
        GraderContext(samples={}).set_sample_reward("missing", 1.0)
    with pytest.raises(ValueError, match="no sample to reward"):
        GraderContext(sample=None).set_reward(1.0)
    sample = RolloutSample()
    with pytest.raises(ValidationError):
        GraderContext(sample=sample).set_reward(math.nan)


def _strands_context(url: str) -> RolloutContext:
    return RolloutContext(
        chat_completions_url=f"{url}/v1/rollouts/s1", rollout_id="s1", api_key="k"
    )


async def test_130_strands_agent_needs_a_context_and_registers_itself(
    mock_trainer: tuple[str, Any],
) -> None:
    from rollout_sdk.integrations.agents.strands import OsmosisRolloutModel, OsmosisStrandsAgent

    with pytest.raises(RuntimeError, match="active RolloutContext"):
        OsmosisStrandsAgent(model=OsmosisRolloutModel(params={}))
    url, gate = mock_trainer
    with _strands_context(url) as ctx:
        agent = OsmosisStrandsAgent(
            name="solver",
            model=OsmosisRolloutModel(params={"temperature": 1.0}),
            messages=[{"role": "user", "content": "hi"}],
            callback_handler=None,
        )
        assert agent.messages[0] == {"role": "user", "content": [{"text": "hi"}]}
        assert list(ctx.sample_sources) == ["solver"]
        with pytest.raises(ValueError, match="already registered"):
            OsmosisStrandsAgent(name="solver", model=OsmosisRolloutModel(), callback_handler=None)
        await agent.invoke_async()
        sample = await ctx.get_sample()
    assert sample is not None
    assert sample.id == "solver"
    assert sample.messages[-1]["content"] == [{"text": "OK."}]
    (call,) = gate.calls
    assert call.headers["x-sample-id"] == "solver"
    assert call.headers["authorization"] == "Bearer k"
    assert call.body["stream"] is True


async def test_131_memory_session_is_the_sample_and_stays_in_its_rollout(
    mock_trainer: tuple[str, Any],
) -> None:
    from agents import Runner

    from rollout_sdk.integrations.agents.openai_agents import (
        OsmosisAgent,
        OsmosisMemorySession,
        OsmosisRolloutModel,
    )

    url, _ = mock_trainer

    class SessionWorkflow(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
            agent = OsmosisAgent(name="a", instructions="be brief", model=OsmosisRolloutModel())
            await Runner.run(agent, ctx.prompt, session=OsmosisMemorySession(name="s1"))

    graded: dict[str, Any] = {}

    class Probe(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            graded["ids"] = list(ctx.samples)
            graded["same"] = ctx.sample is ctx.samples["s1"]
            ctx.set_reward(1.0)

    ctx = RolloutContext(chat_completions_url=f"{url}/v1/rollouts/o1", rollout_id="o1")
    outcome = await execute_rollout(
        WorkflowBundle(SessionWorkflow, grader_cls=Probe),
        ExecutionRequest(id="o1", prompt=[{"role": "user", "content": "hello"}], label="x"),
        ctx,
    )
    assert outcome.result.status is RolloutStatus.SUCCESS, outcome.result.err_message
    assert graded == {"ids": ["s1"], "same": True}

    with RolloutContext(rollout_id="first"):
        session = OsmosisMemorySession(name="s2")
    with RolloutContext(rollout_id="second"), pytest.raises(RuntimeError, match="not registered"):
        await session.get_items()
    plain = OsmosisMemorySession()  # outside any rollout: a plain session
    await plain.add_items([{"role": "user", "content": "x"}])  # type: ignore[list-item]
    assert len(await plain.get_items()) == 1


async def test_132_placeholder_and_missing_session_fail_loudly(
    mock_trainer: tuple[str, Any],
) -> None:
    from agents import Runner

    from rollout_sdk.integrations.agents.openai_agents import OsmosisAgent, OsmosisRolloutModel

    with pytest.raises(NotImplementedError, match="placeholder"):
        await OsmosisRolloutModel().get_response()
    url, gate = mock_trainer
    with RolloutContext(chat_completions_url=f"{url}/v1/rollouts/o2", rollout_id="o2"):
        agent = OsmosisAgent(name="a", instructions="x", model=OsmosisRolloutModel())
        with pytest.raises(RuntimeError, match="OsmosisMemorySession"):
            await Runner.run(agent, "hello")
    assert gate.calls == []


def test_133_workflow_output_is_strict() -> None:
    with pytest.raises(ValidationError, match="foo"):
        AgentWorkflowOutput(messages=[], foo=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        AgentWorkflowOutput(metrics={"x": float("nan")})


def test_134_configs() -> None:
    with pytest.raises(ValidationError, match="name"):
        AgentWorkflowConfig()  # type: ignore[call-arg]
    config = AgentWorkflowConfig(name="w", temperature=0.7)  # type: ignore[call-arg]
    assert config.temperature == 0.7  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        ConcurrencyConfig(max_concurrent=0)


class Echo(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.1)
        return list(ctx.prompt)


def test_135_local_backend_resolves_import_strings() -> None:
    module = types.ModuleType("rollout_test_pkg_mod")
    module.Echo = Echo  # type: ignore[attr-defined]
    sys.modules["rollout_test_pkg_mod"] = module
    try:
        assert LocalBackend(workflow="rollout_test_pkg_mod:Echo").workflow_cls is Echo
        with pytest.raises(ValueError, match=r"package\.module:attr"):
            LocalBackend(workflow="rollout_test_pkg_mod.Echo")
        with pytest.raises(ImportError, match="Nope"):
            LocalBackend(workflow="rollout_test_pkg_mod:Nope")
    finally:
        del sys.modules["rollout_test_pkg_mod"]


class Counting(AgentWorkflow):
    running = 0
    peak = 0

    async def run(self, ctx: AgentWorkflowContext[Any]) -> list[dict[str, Any]]:
        Counting.running += 1
        Counting.peak = max(Counting.peak, Counting.running)
        await asyncio.sleep(0.05)
        Counting.running -= 1
        return []


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        (None, 4),
        (AgentWorkflowConfig(name="w", concurrency=ConcurrencyConfig(max_concurrent=2)), 2),
    ],
)
async def test_136_local_backend_concurrency(
    config: AgentWorkflowConfig | None, limit: int
) -> None:
    Counting.peak = 0
    backend = LocalBackend(workflow=Counting, workflow_config=config)
    requests = [ExecutionRequest(id=f"r{i}", prompt=[], grade=False) for i in range(10)]
    await asyncio.gather(*(backend.execute(r) for r in requests))
    assert Counting.peak == limit


def _module(**members: Any) -> types.ModuleType:
    module = types.ModuleType("entry")
    for name, value in members.items():
        setattr(module, name, value)
    return module


class Solve(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
        return None


class AlsoSolve(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
        return None


def test_137_discovery_rules() -> None:
    bundle = discover_workflow(
        _module(AgentWorkflow=AgentWorkflow, Solve=Solve, alias=Solve), "e.py"
    )
    assert bundle.workflow_cls is Solve
    with pytest.raises(
        DiscoveryError, match=r"Multiple AgentWorkflow subclasses .*\['AlsoSolve', 'Solve'\]"
    ):
        discover_workflow(_module(Solve=Solve, AlsoSolve=AlsoSolve), "e.py")
    with pytest.raises(DiscoveryError, match=r"No AgentWorkflow subclass found in 'e\.py'"):
        discover_workflow(_module(AgentWorkflow=AgentWorkflow), "e.py")
    one, two = AgentWorkflowConfig(name="a"), AgentWorkflowConfig(name="b")
    with pytest.raises(DiscoveryError, match="Multiple AgentWorkflowConfig instances"):
        discover_workflow(_module(Solve=Solve, one=one, two=two), "e.py")
    assert discover_workflow(_module(Solve=Solve, one=one), "e.py").workflow_config is one
    backend = LocalBackend(workflow=AlsoSolve)
    assert (
        discover_workflow(_module(Solve=Solve, backend=backend), "e.py").workflow_cls is AlsoSolve
    )


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [
        ("rollout_sdk.integrations.agents.strands", "strands", "strands"),
        ("rollout_sdk.integrations.agents.openai_agents", "agents", "openai-agents"),
    ],
)
def test_an_integration_without_its_framework_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, framework: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, framework, None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ModuleNotFoundError, match=rf"pip install 'rollout-sdk\[{extra}\]'"):
        __import__(module)


async def test_openai_agents_streamed_runs_work_too(mock_trainer: tuple[str, Any]) -> None:
    from agents import Runner

    from rollout_sdk.integrations.agents.openai_agents import (
        OsmosisAgent,
        OsmosisMemorySession,
        OsmosisRolloutModel,
    )

    url, gate = mock_trainer
    with RolloutContext(chat_completions_url=f"{url}/v1/rollouts/st1", rollout_id="st1") as ctx:
        agent = OsmosisAgent(name="a", instructions="be brief", model=OsmosisRolloutModel())
        streamed = Runner.run_streamed(agent, "hello", session=OsmosisMemorySession(name="s"))
        events = [event async for event in streamed.stream_events()]
        sample = await ctx.get_sample()
    assert events
    assert streamed.final_output == "OK."
    assert sample is not None
    assert len(sample.messages) == 2
    (call,) = gate.calls
    assert call.body["stream"] is True
    assert call.headers["x-sample-id"] == "s"
