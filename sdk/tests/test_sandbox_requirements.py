"""The SDK's locked requirements for workflow sandboxes match ``uv.lock``.

A workflow's sandbox layer installs the pins and hashes in
``rollout_sdk/backend/harbor/locked/`` (docs/SANDBOXES.md); a lock changed without
re-exporting them would build sandboxes from the old lock. The fix is one command:
``uv run python scripts/sandbox_requirements.py``.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sandbox_requirements.py"
LOCKED = REPO / "sdk" / "rollout_sdk" / "backend" / "harbor" / "locked"
REGENERATE = "uv run python scripts/sandbox_requirements.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sandbox_requirements", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_sandbox_requirements_match_the_lock() -> None:
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH (it exports the lock)")
    wanted: dict[str, str] = _script().expected()
    shipped = {path.name: path.read_text() for path in LOCKED.glob("*.txt")}
    stale = sorted(
        name for name in wanted.keys() | shipped.keys() if wanted.get(name) != shipped.get(name)
    )
    assert not stale, f"stale against uv.lock: {', '.join(stale)}; run {REGENERATE}"
    # Every extra but `all` has its file, and every pin carries the lock's hashes.
    assert {"sdk.txt", "strands.txt", "openai-agents.txt", "harbor.txt"} <= shipped.keys()
    for name, text in shipped.items():
        pins = [line for line in text.splitlines() if "==" in line]
        assert pins, name
        assert text.count("==") <= text.count("--hash=sha256:"), name
