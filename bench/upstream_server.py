"""The upstream baseline's server: the genuine ``osmosis-ai`` 0.3.8 ``create_rollout_server``
on its ``LocalBackend`` for a v2 agent file, or on the backend the file builds (its
``HarborBackend``), in one process — run by the python of the venv that bench/upstream.py
builds, never by ours:

    python bench/upstream_server.py path/to/agent.py PORT

The agent file is imported with upstream's own entrypoint loader; its parts are found by the
rules our loader follows (a module-level backend, or one concrete ``AgentWorkflow`` subclass
with at most one workflow config, grader and grader config). A backend with a
``prewarm_lifespan`` (Harbor's: it builds the task's environment) prewarms before the server
listens, as upstream's template serves it. Served by uvicorn at 127.0.0.1:PORT, log level
warning (the agent file may have set up upstream's INFO logging: it is raised to warning), as
bench/baseline_v2.py serves ours.

Like ours (``settle_heap`` in our server's lifespan), the heap is frozen (``gc.freeze()``)
once the server has started, so neither side's garbage collector rescans the imported
modules on every full collection; upstream does not do this itself, and
``BENCH_UPSTREAM_GC_FREEZE=0`` measures it as shipped.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import osmosis_ai  # type: ignore[import-not-found]
import uvicorn
from fastapi import FastAPI
from osmosis_ai.platform.cli.rollout_entrypoint import load_rollout_entrypoint  # type: ignore[import-not-found]
from osmosis_ai.rollout import (  # type: ignore[import-not-found]
    AgentWorkflow,
    AgentWorkflowConfig,
    ExecutionBackend,
    Grader,
    GraderConfig,
    LocalBackend,
)
from osmosis_ai.rollout.server import create_rollout_server  # type: ignore[import-not-found]


def _check_upstream() -> None:
    """The genuine package, and none of ours: our SDK's alias must play no part here."""
    if importlib.util.find_spec("rollout_sdk") is not None:
        raise SystemExit(
            f"rollout_sdk is importable here (sys.path={sys.path}); run me with "
            "the upstream venv's python and no PYTHONPATH"
        )
    if osmosis_ai.__version__ != "0.3.8":
        raise SystemExit(f"expected osmosis-ai 0.3.8, found {osmosis_ai.__version__}")


def _found(module: ModuleType, matches: Callable[[Any], bool]) -> list[Any]:
    return list({id(v): v for v in vars(module).values() if matches(v)}.values())


def _one(module: ModuleType, matches: Callable[[Any], bool], what: str, needed: bool) -> Any:
    found = _found(module, matches)
    if len(found) > 1 or (needed and not found):
        raise SystemExit(
            f"{module.__file__}: expected {'one' if needed else 'at most one'} "
            f"{what}, found {len(found)}"
        )
    return found[0] if found else None


def _subclass(base: type) -> Callable[[Any], bool]:
    return lambda v: (
        inspect.isclass(v) and issubclass(v, base) and v is not base and not inspect.isabstract(v)
    )


def backend_for(agent: Path) -> ExecutionBackend:
    module = load_rollout_entrypoint(agent.parent, agent.name)
    backends = _found(module, lambda v: isinstance(v, ExecutionBackend))
    if backends:
        return backends[0]
    return LocalBackend(
        workflow=_one(module, _subclass(AgentWorkflow), "AgentWorkflow subclass", True),
        workflow_config=_one(
            module, lambda v: isinstance(v, AgentWorkflowConfig), "workflow config", False
        ),
        grader=_one(module, _subclass(Grader), "Grader subclass", False),
        grader_config=_one(module, lambda v: isinstance(v, GraderConfig), "grader config", False),
    )


def lifespan_for(backend: ExecutionBackend) -> Callable[[FastAPI], Any]:
    """The backend's prewarm, if it has one, then the heap frozen."""
    prewarm = getattr(backend, "prewarm_lifespan", None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if prewarm is not None:
                await stack.enter_async_context(prewarm()(app))
            if os.environ.get("BENCH_UPSTREAM_GC_FREEZE", "1") != "0":
                gc.freeze()
            yield

    return lifespan


def main(agent: str, port: int) -> None:
    # A script's folder (here bench/) is sys.path[0]: it holds our bench modules and a package
    # named ``agents`` (as openai-agents' is), none of which the agent should import.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    _check_upstream()
    backend = backend_for(Path(agent).resolve())
    logging.getLogger().setLevel(logging.WARNING)
    app = create_rollout_server(
        backend=backend, lifespan=lifespan_for(backend), configure_logging=False
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
