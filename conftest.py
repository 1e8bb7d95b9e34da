"""What every test session shares, the fleet's (``tests/``) and the SDK's (``sdk/tests/``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_sdk.backend.artifacts import ARTIFACT_ROOT_ENV


@pytest.fixture(scope="session", autouse=True)
def artifact_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Rollouts' artifacts directories (S§2.14) go under the session's temporary directory,
    in this process and in every process a test starts, not under ``~/.osmosis``."""
    root = tmp_path_factory.mktemp("artifacts")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ARTIFACT_ROOT_ENV, str(root))
        yield root
