"""The Harbor agent that runs a user's ``AgentWorkflow`` inside the sandbox.

Harbor builds its agents from an import path, in this process, so the backend hands this
agent its rollout through :data:`STAGED` (keyed by trial name) rather than through Harbor's
agent config, which Harbor writes to the trial's folder: the TrainGate key must never be
there, nor on a command line (``docker compose exec -e`` would show it, and an error quoting
the command would carry it into the rollout's result). The key goes into the sandbox as a
file of its own, which the runner reads and deletes first.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent

from rollout_sdk.backend.harbor.in_sandbox import (
    AGENT_LOGS,
    KEY_FILE,
    ROLLOUT_FILE,
    STAGE,
    WORKFLOW_RESULT,
    StagedRollout,
)
from rollout_sdk.backend.harbor.workflows import PYTHON, PYTHONPATH

IMPORT_PATH = "rollout_sdk.backend.harbor.harness:SandboxedWorkflow"


@dataclass(frozen=True)
class Staging:
    rollout: StagedRollout
    api_key: str | None
    timeout_sec: float | None


STAGED: dict[str, Staging] = {}  # trial name → what its agent runs


class SandboxedWorkflow(BaseAgent):  # type: ignore[misc]
    @staticmethod
    def name() -> str:
        return "rollout-sdk-workflow"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: Any) -> None:
        return None

    async def run(self, instruction: str, environment: Any, context: Any) -> None:
        trial = Path(self.logs_dir).parent.name
        staging = STAGED[trial]
        await environment.exec(command=f"mkdir -p {STAGE} && chmod 700 {STAGE}", user="root")
        with tempfile.TemporaryDirectory() as folder:
            rollout = Path(folder) / ROLLOUT_FILE
            rollout.write_text(staging.rollout.model_dump_json())
            await environment.upload_file(rollout, str(STAGE / ROLLOUT_FILE))
            if staging.api_key is not None:
                key = Path(folder) / KEY_FILE
                key.touch(mode=0o600)
                key.write_text(staging.api_key)
                await environment.upload_file(key, str(STAGE / KEY_FILE))
        result = await environment.exec(
            command=f"{PYTHON} -m rollout_sdk.backend.harbor.in_sandbox run",
            env={"PYTHONPATH": PYTHONPATH, "PYTHONUNBUFFERED": "1"},
            timeout_sec=int(staging.timeout_sec) + 30 if staging.timeout_sec else None,
        )
        host = Path(self.logs_dir) / WORKFLOW_RESULT
        if not host.is_file():
            try:
                await environment.download_file(str(AGENT_LOGS / WORKFLOW_RESULT), host)
            except Exception:
                self.logger.warning("no workflow result in the sandbox")
        if result.return_code != 0:
            (Path(self.logs_dir) / "exit-code.txt").write_text(str(result.return_code))
            output = (result.stdout or "")[-4000:]
            (Path(self.logs_dir) / "workflow-output.txt").write_text(output)


__all__ = ["IMPORT_PATH", "STAGED", "SandboxedWorkflow", "Staging"]
