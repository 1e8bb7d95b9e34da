"""The v2 baseline: our in-process rollout server (``create_rollout_server`` on a
``LocalBackend``) for a v2 agent, in one process — what a user runs without the fleet.

    python -m bench.baseline_v2 path/to/agent.py PORT
"""

from __future__ import annotations

import sys

import uvicorn

from rollout_sdk import LocalBackend, create_rollout_server
from rollout_sdk.backend.execution import WorkflowBundle
from rollout_sdk.loader import load_agent


def main(reference: str, port: int) -> None:
    bundle = load_agent(reference)
    if not isinstance(bundle, WorkflowBundle):
        raise SystemExit(f"{reference} is not a v2 agent")
    backend = LocalBackend(
        workflow=bundle.workflow_cls,
        workflow_config=bundle.workflow_config,
        grader=bundle.grader_cls,
        grader_config=bundle.grader_config,
    )
    app = create_rollout_server(backend=backend, configure_logging=False)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
