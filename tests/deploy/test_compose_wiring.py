"""The compose-as-processes harness really runs what the file declares: a change to a
command, a variable name or a port that breaks the wiring makes the stack fail to come up."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_fleet.processes import free_port
from tests.deploy.compose import ComposeAsProcesses
from tests.deploy.conftest import planted_secrets, project
from tests.deploy.dockerfile import ImageBuilder
from tests.harness import REPO

# what breaks → (text in docker-compose.yml, its broken replacement). Not among them: a
# misnamed REDIS_URL, which here would fall back to a Redis on this host's 6379 (inside a
# container 127.0.0.1 is the container itself, which this harness cannot imitate).
BREAKAGES = {
    "gateway listens off its declared port": (
        'command: ["gateway", "--port", "${GATEWAY_PORT:-8000}"',
        'command: ["gateway", "--port", "${FLOWER_PORT:-5555}"',
    ),
    "worker command misspelt": ('command: ["worker"]', 'command: ["workers"]'),
    "agent mounted elsewhere": ("target: /agent\n", "target: /agents\n"),
    "redis password not passed": (
        "      REDIS_PASSWORD: ${REDIS_PASSWORD:?set",
        "      NO_PASSWORD: ${REDIS_PASSWORD:?set",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_wiring_keeps_the_stack_from_coming_up(
    tmp_path: Path, breakage: str, image_builder: ImageBuilder
) -> None:
    original, broken = BREAKAGES[breakage]
    text = (REPO / "docker-compose.yml").read_text()
    assert text.count(original) == 1, f"the compose file changed: update {breakage!r}"
    settings = {k: v for k, v in planted_secrets().items() if k != "TRAINER_API_KEY"}
    settings |= {name: str(free_port()) for name in ("GATEWAY_PORT", "FLOWER_PORT", "REDIS_PORT")}
    folder = project(tmp_path / "project", settings, text.replace(original, broken))
    compose = ComposeAsProcesses(folder, tmp_path / "run", image_builder)
    try:
        with pytest.raises(AssertionError, match=r"exited|failed its healthcheck"):
            compose.up(timeout=20)
    finally:
        compose.down()
