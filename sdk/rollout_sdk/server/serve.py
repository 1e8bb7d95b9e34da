"""``serve_agent_loop``: validate an agent loop and serve it in-process with uvicorn."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rollout_sdk import _compat
from rollout_sdk._compat import missing_server_extra
from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.config import RolloutSettings
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.loader import Agent
from rollout_sdk.server.api_key import generate_api_key
from rollout_sdk.validator import ValidationResult, validate_agent_loop, validate_workflow

logger = logging.getLogger(__name__)

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 9000


class ServeError(Exception):
    """The server cannot start with the given options."""


def validate_and_report(agent: Agent, *, verbose: bool = False) -> ValidationResult:
    """Validate either generation's agent and print a human-readable report."""
    if isinstance(agent, RolloutAgentLoop):
        kind, result = "Agent loop", validate_agent_loop(agent)
        facts = [f"Tools: {result.tool_count}"]
    elif isinstance(agent, ExecutionBackend):  # built and checked by its own constructor
        kind, result = "Backend", ValidationResult(valid=True, agent_name=agent.name)
        facts = [f"Runs rollouts on: {type(agent).__name__}"]
    else:
        kind, result = "Agent workflow", validate_workflow(agent)
        grader = agent.grader_cls.__name__ if agent.grader_cls else "none"
        facts = [f"Workflow: {agent.workflow_cls.__name__}", f"Grader: {grader}"]
    if result.valid:
        print(f"{kind} '{result.agent_name}' validated successfully.")
        for fact in facts:
            print(f"  - {fact}")
    else:
        print(f"{kind} validation failed with {len(result.errors)} error(s):")
        for error in result.errors:
            print(f"  - {error}")
    if verbose or not result.valid:
        for warning in result.warnings:
            print(f"  warning: {warning}")
    return result


def resolve_api_key(api_key: str | None, local_debug: bool) -> str | None:
    """No key in local-debug mode; otherwise the given key or a freshly generated one."""
    if local_debug:
        if api_key is not None:
            raise ServeError(
                "local_debug=True disables API key authentication; "
                "do not provide api_key in local debug mode."
            )
        return None
    return api_key or generate_api_key()


def serve_agent_loop(
    agent_loop: RolloutAgentLoop,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    validate: bool = True,
    log_level: str = "info",
    reload: bool = False,
    settings: RolloutSettings | None = None,
    skip_register: bool = False,
    api_key: str | None = None,
    local_debug: bool = False,
    debug_dir: str | None = None,
) -> None:
    """Validate, resolve the server key, and run the in-process server until interrupted."""
    if not _compat.FASTAPI_AVAILABLE:
        raise missing_server_extra("FastAPI", "serve_agent_loop")
    if not _compat.UVICORN_AVAILABLE:
        raise missing_server_extra("uvicorn", "serve_agent_loop")
    import uvicorn

    from rollout_sdk.server.app import create_app

    if validate:
        validate_agent_loop(agent_loop).raise_if_invalid()
    key = resolve_api_key(api_key, local_debug)
    if key is not None and api_key is None:
        print(f"Generated server API key: {key}")
    if not (skip_register or local_debug):
        logger.info("platform registration is not supported here; serving without it")
    if reload:
        logger.warning("--reload is not supported for an agent loop object; ignoring it")
    trace_dir = None
    if debug_dir is not None:
        trace_dir = str(Path(debug_dir) / str(int(time.time())))
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    app = create_app(agent_loop, settings=settings, api_key=key, debug_dir=trace_dir)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ServeError",
    "resolve_api_key",
    "serve_agent_loop",
    "validate_and_report",
]
