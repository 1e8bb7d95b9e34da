"""The second baseline: the real upstream ``osmosis-ai`` 0.3.8 rollout server
(``create_rollout_server`` on its ``LocalBackend``) in one process, as its users run it.

It runs in a virtual environment of its own (upstream needs Python >= 3.12; ours is 3.11,
and the real ``osmosis_ai`` package must not shadow our import alias), built once and cached
under ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/rollout-fleet-bench/osmosis-ai-0.3.8``:

    from bench.upstream import upstream_baseline, upstream_python
    upstream_python()                      # builds the venv if needed; its python
    with upstream_baseline("bench/agents/strands_osmosis.py") as system:
        ...                                # drive system.url like any other System

The agent file is written against the ``osmosis_ai`` names, so the same file runs natively
here and on our fleet or in-process server through our alias.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.systems import System, _serve
from bench.workloads import REPO
from rollout_fleet.processes import free_port, wait_until

NAME = "upstream osmosis-ai 0.3.8"
REFERENCE = "osmosis-ai==0.3.8"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollout-fleet-bench"
VENV = CACHE / REFERENCE.replace("==", "-")
SERVER = REPO / "bench" / "upstream_server.py"
STAMP = ".rollout-fleet-bench.json"  # written last: the venv is complete when it is there

# Upstream 0.3.8 pins a certifi newer than the package index here has, so it is installed
# without its dependencies and these are added by hand: what its rollout server and its
# Strands integration import. Those our uv.lock also has are pinned to our versions, so both
# baselines run the same framework, web stack and event loop (uvicorn picks uvloop and
# httptools up by itself, as ours does).
LOCKED = (
    "strands-agents",
    "openai",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "pydantic",
    "httpx",
    "anyio",
    "python-dotenv",
)
# Upstream's Strands model is strands' LiteLLMModel (ours uses strands' OpenAIModel, no
# litellm): litellm is not in our lock, so it takes upstream's own range.
UNLOCKED = ("litellm>=1.94.3,!=1.95.0.*,!=1.96.0.*,!=1.96.1.*,<2",)


class UpstreamUnavailable(RuntimeError):
    """The upstream baseline cannot run on this machine (no Python >= 3.12, or no uv)."""


def python_312() -> str | None:
    """A Python >= 3.12 interpreter (upstream osmosis-ai 0.3.8 needs one; the reference-client
    conformance test finds it here too); a pyenv shim for a version not selected fails the
    probe and is skipped."""
    candidates = [
        shutil.which("python3.12"),
        "/usr/bin/python3.12",
        *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python3"))),
    ]
    for candidate in filter(None, candidates):
        if not Path(candidate).exists():
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    return None


def requirements() -> list[str]:
    """What the venv gets besides ``osmosis-ai`` itself, versions taken from our uv.lock."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    versions = {package["name"]: package["version"] for package in lock["package"]}
    return [f"{name}=={versions[name]}" for name in LOCKED if name in versions] + [
        *(name for name in LOCKED if name not in versions),
        *UNLOCKED,
    ]


def upstream_python() -> Path:
    """The venv's python, building the venv first if it is missing or was built from other
    requirements. Raises :class:`UpstreamUnavailable` when it cannot be built here."""
    python = VENV / "bin" / "python"
    wanted = {"reference": REFERENCE, "requirements": requirements()}
    stamp = VENV / STAMP
    with contextlib.suppress(OSError, ValueError):
        if python.exists() and json.loads(stamp.read_text()) == wanted:
            return python
    interpreter, uv = python_312(), shutil.which("uv")
    if interpreter is None:
        raise UpstreamUnavailable(
            f"{REFERENCE} needs Python >= 3.12: none found (python3.12 on PATH, "
            "/usr/bin/python3.12, ~/.pyenv/versions/3.12+)"
        )
    if uv is None:
        raise UpstreamUnavailable(f"building the {REFERENCE} venv needs uv on PATH")
    shutil.rmtree(VENV, ignore_errors=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([uv, "venv", "-q", "-p", interpreter, str(VENV)], check=True)
    # Compiled now: PYTHONDONTWRITEBYTECODE may be set, and litellm takes seconds to import.
    install = [uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(python)]
    subprocess.run([*install, "--no-deps", REFERENCE], check=True)
    subprocess.run([*install, *wanted["requirements"]], check=True)
    stamp.write_text(json.dumps(wanted))
    return python


def _env(artifacts: str, extra: dict[str, str] | None) -> dict[str, str]:
    """The server's environment: ours, less anything that would put our repo (and so our
    ``rollout_sdk``) on its path."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    return {
        **env,
        "PYTHONNOUSERSITE": "1",
        # litellm would otherwise fetch its model price list from the internet at import.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # Upstream writes each rollout's trajectory.json (and an artifacts dir) under
        # ~/.osmosis by default; keep them in a directory removed afterwards. The writes
        # themselves are upstream's cost and stay in.
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": artifacts,
        **(extra or {}),
    }


@contextlib.contextmanager
def upstream_baseline(agent: str, env: dict[str, str] | None = None) -> Iterator[System]:
    """Upstream's in-process v2 server for ``agent`` (a ``path/to/file.py``) in one process,
    started like :func:`bench.systems.baseline`; ``roles == {"baseline": [pid]}``."""
    python = upstream_python()
    port = free_port()
    argv = [str(python), str(SERVER), str(Path(agent).resolve()), str(port)]
    with tempfile.TemporaryDirectory(prefix="osmosis-artifacts-") as artifacts:
        process = _serve("upstream", argv, port, _env(artifacts, env))
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 30, "upstream health")
            yield System(NAME, url, {"baseline": [process.pid]})
        finally:
            process.stop()


__all__ = [
    "NAME",
    "REFERENCE",
    "UpstreamUnavailable",
    "python_312",
    "requirements",
    "upstream_baseline",
    "upstream_python",
]
