"""The second baseline: the real upstream ``osmosis-ai`` 0.3.8 rollout server
(``create_rollout_server`` on its ``LocalBackend``, or on the backend an agent module builds,
such as its ``HarborBackend``) in one process, as its users run it.

It runs in a virtual environment of its own (upstream needs Python >= 3.12, and the real
``osmosis_ai`` package must not shadow our import alias), built once and cached under
``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/rollout-fleet-bench/``: ``osmosis-ai-0.3.8`` for its
Strands workflows (:data:`STRANDS`), ``osmosis-ai-0.3.8-harbor`` for its Harbor sandboxes
(:data:`HARBOR`):

    from bench.upstream import HARBOR, upstream_baseline, upstream_python
    upstream_python()                      # builds the venv if needed; its python
    with upstream_baseline("bench/agents/strands_osmosis.py") as system:
        ...                                # drive system.url like any other System
    with upstream_baseline("rollout/main.py", venv=HARBOR) as system:
        ...                                # system.artifacts: upstream's per-rollout files

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
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.systems import System, _serve
from bench.workloads import REPO
from rollout_fleet.processes import free_port, wait_until

NAME = "upstream osmosis-ai 0.3.8"
REFERENCE = "osmosis-ai==0.3.8"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollout-fleet-bench"
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
# The web stack and event loop, pinned to our lock's versions in every venv (the server's
# own cost is then the same code on both sides).
WEB_STACK = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic", "httpx", "anyio")


@dataclass(frozen=True)
class Venv:
    """One of upstream's virtualenvs: what it installs, and its folder under :data:`CACHE`."""

    folder: str
    reference: str  # osmosis-ai's requirement, extras included
    locked: tuple[str, ...]  # installed at our uv.lock's versions (any version when not there)
    unlocked: tuple[str, ...] = ()
    # False: the reference without its dependencies, only ``locked`` and ``unlocked`` beside
    # it. True: one resolution of the reference (its extras' dependencies too) and the rest.
    dependencies: bool = False

    @property
    def path(self) -> Path:
        return CACHE / self.folder


STRANDS = Venv(REFERENCE.replace("==", "-"), REFERENCE, LOCKED, UNLOCKED)
# Upstream's HarborBackend as its users install it (harbor>=0.20,<0.25 by its own pin, with
# the extras that pin names), the web stack at our versions.
HARBOR = Venv(
    "osmosis-ai-0.3.8-harbor", "osmosis-ai[harbor,server]==0.3.8", WEB_STACK, dependencies=True
)


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


def requirements(venv: Venv = STRANDS) -> list[str]:
    """What the venv gets besides ``osmosis-ai`` itself, versions taken from our uv.lock."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    versions = {package["name"]: package["version"] for package in lock["package"]}
    return [f"{name}=={versions[name]}" for name in venv.locked if name in versions] + [
        *(name for name in venv.locked if name not in versions),
        *venv.unlocked,
    ]


def upstream_python(venv: Venv = STRANDS) -> Path:
    """The venv's python, building the venv first if it is missing or was built from other
    requirements. Raises :class:`UpstreamUnavailable` when it cannot be built here."""
    python = venv.path / "bin" / "python"
    wanted = {"reference": venv.reference, "requirements": requirements(venv)}
    stamp = venv.path / STAMP
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
    shutil.rmtree(venv.path, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([uv, "venv", "-q", "-p", interpreter, str(venv.path)], check=True)
    # Compiled now: PYTHONDONTWRITEBYTECODE may be set, and litellm takes seconds to import.
    install = [uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(python)]
    if venv.dependencies:
        subprocess.run([*install, venv.reference, *wanted["requirements"]], check=True)
    else:
        subprocess.run([*install, "--no-deps", venv.reference], check=True)
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
def upstream_baseline(
    agent: str,
    env: dict[str, str] | None = None,
    venv: Venv = STRANDS,
    start_seconds: float = 60,
) -> Iterator[System]:
    """Upstream's in-process v2 server for ``agent`` (a ``path/to/file.py``) in one process,
    started like :func:`bench.systems.baseline`; ``roles == {"baseline": [pid]}``.
    ``start_seconds`` bounds its start, its lifespan (a Harbor backend's prewarm) included;
    ``System.artifacts`` is where it writes each rollout's files, removed on exit."""
    python = upstream_python(venv)
    port = free_port()
    argv = [str(python), str(SERVER), str(Path(agent).resolve()), str(port)]
    with tempfile.TemporaryDirectory(prefix="osmosis-artifacts-") as artifacts:
        process = _serve("upstream", argv, port, _env(artifacts, env), start_seconds)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 30, "upstream health")
            yield System(NAME, url, {"baseline": [process.pid]}, artifacts=Path(artifacts))
        finally:
            process.stop()


__all__ = [
    "HARBOR",
    "NAME",
    "REFERENCE",
    "STRANDS",
    "UpstreamUnavailable",
    "Venv",
    "python_312",
    "requirements",
    "upstream_baseline",
    "upstream_python",
]
