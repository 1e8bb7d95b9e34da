"""The side of a sandboxed workflow that runs inside the sandbox.

``python -m rollout_sdk.backend.harbor.in_sandbox run`` runs the user's ``AgentWorkflow`` on
the rollout the host staged in :data:`STAGE` (``rollout.json``, and the TrainGate key in a file
of its own, read and deleted first), talking to the TrainGate through the rollout's chat URL,
and writes the workflow's result to the agent's log folder. ``... grade`` runs the ``Grader``
on that result as the trial's verifier and writes the reward where Harbor reads it.

Only the standard library, pydantic and httpx (the SDK's own dependencies) are needed here:
nothing imports Harbor.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

STAGE = Path("/run/rollout-sandbox")
ROLLOUT_FILE = "rollout.json"
KEY_FILE = "key"
AGENT_LOGS = Path("/logs/agent")
VERIFIER_LOGS = Path("/logs/verifier")
WORKFLOW_RESULT = "rollout-result.json"
GRADED_RESULT = "rollout-graded.json"


class StagedRollout(BaseModel):
    """What the host hands the sandbox (never the key: that has a file of its own)."""

    request: dict[str, Any]
    chat_completions_url: str
    workflow: str  # "package.module:Class"
    workflow_config: str | None = None  # "package.module:attribute"
    grader: str | None = None
    grader_config: str | None = None


def _load(reference: str | None) -> Any:
    from rollout_sdk.backend.local import resolve_object

    return resolve_object(reference) if reference else None


def _bundle(staged: StagedRollout) -> Any:
    from rollout_sdk.backend.execution import WorkflowBundle

    return WorkflowBundle(
        workflow_cls=_load(staged.workflow),
        workflow_config=_load(staged.workflow_config),
        grader_cls=_load(staged.grader),
        grader_config=_load(staged.grader_config),
    )


def _staged() -> StagedRollout:
    return StagedRollout.model_validate_json((STAGE / ROLLOUT_FILE).read_text())


def run() -> int:
    from rollout_sdk.backend.execution import run_workflow
    from rollout_sdk.compat import install_osmosis_alias
    from rollout_sdk.context import RolloutContext
    from rollout_sdk.types.sample import ExecutionRequest

    install_osmosis_alias()  # user code imports osmosis_ai
    staged = _staged()
    key_file = STAGE / KEY_FILE
    key = key_file.read_text() if key_file.is_file() else None
    key_file.unlink(missing_ok=True)
    request = ExecutionRequest.model_validate(staged.request)
    ctx = RolloutContext(
        chat_completions_url=staged.chat_completions_url, api_key=key, rollout_id=request.id
    )
    result = asyncio.run(run_workflow(_bundle(staged), request, ctx))
    AGENT_LOGS.mkdir(parents=True, exist_ok=True)
    (AGENT_LOGS / WORKFLOW_RESULT).write_text(result.model_dump_json())
    return 0


def grade() -> int:
    from rollout_sdk.backend.execution import run_grader
    from rollout_sdk.compat import install_osmosis_alias
    from rollout_sdk.types.sample import ExecutionRequest, ExecutionResult, RolloutStatus

    install_osmosis_alias()
    staged = _staged()
    request = ExecutionRequest.model_validate(staged.request)
    VERIFIER_LOGS.mkdir(parents=True, exist_ok=True)
    result_file = AGENT_LOGS / WORKFLOW_RESULT
    ran = (
        ExecutionResult.model_validate_json(result_file.read_text())
        if result_file.is_file()
        else None
    )
    reward: float | None = None
    if ran is not None and ran.sample is not None:
        # In the workflow's process the first sample and its entry in ``samples`` are one
        # object, which the grader rewards once; JSON made them two: make them one again.
        first = ran.sample
        samples = {
            name: first if sample == first else sample for name, sample in ran.samples.items()
        }
        ran = ran.model_copy(update={"samples": samples})
    if ran is not None and ran.status is RolloutStatus.SUCCESS:
        graded = asyncio.run(run_grader(_bundle(staged), request, ran))
        (VERIFIER_LOGS / GRADED_RESULT).write_text(graded.model_dump_json())
        reward = graded.sample.reward if graded.sample is not None else None
    (VERIFIER_LOGS / "reward.txt").write_text(f"{reward if reward is not None else 0}\n")
    return 0


def main(argv: list[str]) -> int:
    commands = {"run": run, "grade": grade}
    if len(argv) != 1 or argv[0] not in commands:
        print("usage: python -m rollout_sdk.backend.harbor.in_sandbox run|grade", file=sys.stderr)
        return 2
    return commands[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
