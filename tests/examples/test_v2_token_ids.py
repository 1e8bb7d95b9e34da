"""v2 rollouts on the real Strands and OpenAI Agents packages,
streamed and not, exported by ``rollout-fleet export`` with each LLM turn's token ids and
logprobs equal to what the mock TrainGate sent, asked for them as vLLM is
(``return_token_ids``, ``logprobs``), each turn named by its sample (real Redis, gateway,
Celery worker and mock TrainGate processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import V2_ENV, module_fleet
from tests.harness import REPO, V2FleetUnderTest, exported, new_id

TOKEN_IDS_AGENT = str(REPO / "tests/agents/token_ids_v2.py")
CASES = [
    (framework, stream) for framework in ("strands", "openai_agents") for stream in (True, False)
]
# Each sample asks for the tool, then answers; the workflow runs its samples one after the other.
SAMPLE_IDS = ["first", "first", "second", "second"]

fleet = module_fleet(
    TOKEN_IDS_AGENT, workers=1, gateways=1, concurrency=8, handle=V2FleetUnderTest, env=V2_ENV
)


def check_turns(line: dict[str, Any], calls: list[dict[str, Any]], stream: bool) -> None:
    turns = line["turns"]
    assert len(turns) == len(calls) == len(SAMPLE_IDS)
    assert [turn["sample_id"] for turn in turns] == SAMPLE_IDS
    for turn, call in zip(turns, calls, strict=True):
        body = call["body"]
        assert bool(body.get("stream")) is stream
        assert (body["return_token_ids"], body["logprobs"]) == (True, True)  # the worker asked
        assert call["headers"]["x-sample-id"] == turn["sample_id"]
        sent = call["answer"]
        assert turn["token_ids"] == sent["token_ids"]
        assert turn["logprobs"] == sent["logprobs"]
        assert turn["prompt_token_ids"] == sent["prompt_token_ids"]
        assert turn["prompt_token_ids"]  # every answer has some
        if turn["usage"]:  # a stream carries it only when asked (stream_options)
            assert turn["usage"]["completion_tokens"] == len(turn["token_ids"])
    answers = turns[1::2]  # "#### 42" after the tool: completion tokens of their own
    assert all(len(turn["token_ids"]) == len("#### 42") for turn in answers)
    assert all(turn["finish_reason"] == "stop" for turn in answers)


def test_export_carries_each_turns_token_ids_and_logprobs(
    fleet: V2FleetUnderTest, tmp_path: Path
) -> None:
    tokens, streamed = {}, {}
    for framework, stream in CASES:
        rollout_id = new_id(f"{framework}-{'sse' if stream else 'json'}")
        tokens[rollout_id] = fleet.admitted(
            rollout_id=rollout_id,
            metadata={"framework": framework, "stream": stream},
            llm_api_key=f"key-{rollout_id}",
        )[1]
        streamed[rollout_id] = stream
    for rollout_id, token in tokens.items():
        final = fleet.result(rollout_id, token)
        assert final["status"] == "success", final
    lines, text = exported(fleet, tmp_path)
    for rollout_id, stream in streamed.items():
        check_turns(lines[rollout_id], fleet.trainer.calls("chat", rollout_id), stream)
    assert "key-" not in text  # no rollout's key in a trajectory
