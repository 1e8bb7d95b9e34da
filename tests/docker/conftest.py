"""tests/docker/: the compose stack on a real Docker engine.

The engine is the one ``DOCKER_HOST`` names, else the test engine ``scripts/docker-test-engine``
runs (started here, and stopped at the end, when it is not running yet). The suite skips only
when no engine can be started here (no ``dockerd``, not root); under CI it fails instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from bench.sandboxes import docker_host
from rollout_sdk.backend.harbor.engine import BUILT_LABEL
from tests.docker.stack import (
    COMPOSE_PLUGIN,
    Stack,
    compose_project,
    connect,
    engine_script,
    readme_compose_commands,
)

# Cold image builds (a new machine) take minutes; each stack's `up --wait` about 40 s.
TIMEOUT = 1200


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.timeout(TIMEOUT))


def no_engine(reason: str) -> None:
    message = f"no Docker engine: {reason} (scripts/docker-test-engine install && start)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run tests/docker")
    pytest.skip(message)


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    """The engine, with the stand-in base images (built once, kept by recipe)."""
    started_here = False
    client = connect(docker_host())
    if client is None:
        if shutil.which("dockerd") is None:
            no_engine("dockerd is not installed")
        if os.geteuid() != 0:
            no_engine("dockerd runs as root here, and this is not root")
        start = engine_script("start", timeout=120)
        client = connect(docker_host())
        if client is None:
            no_engine(f"dockerd did not start: {start.stderr}")
        started_here = True
    assert client is not None
    images = engine_script("images")
    assert images.returncode == 0, f"stand-in base images: {images.stderr}"
    before = engine_objects(client)
    try:
        yield client
        left_behind(client, before)
    finally:
        client.close()
        if started_here:
            engine_script("stop", timeout=120)


def engine_objects(client: docker.DockerClient) -> dict[str, set[str]]:
    return {
        "containers": {c.id for c in client.containers.list(all=True)},
        "networks": {n.id for n in client.networks.list()},
        "volumes": {v.id for v in client.volumes.list()},
        "images": {i.id for i in client.images.list(all=True)},
    }


def left_behind(client: docker.DockerClient, before: dict[str, set[str]]) -> None:
    """Nothing the suite made is left on the engine: no container, network or volume (a
    failed build's container included). The images sandboxes built (the fleet's label) and
    untagged ones (the layers of builds that failed) are removed; then no untagged image may
    be left. The compose stack's own images stay: they are the next run's cache."""
    after = engine_objects(client)
    new = {kind: after[kind] - before[kind] for kind in after}
    sandbox_images = {i.id for i in client.images.list(filters={"label": BUILT_LABEL})}
    dangling = {i.id for i in client.images.list(filters={"dangling": True})}
    for image in new["images"] & (sandbox_images | dangling):
        with contextlib.suppress(docker.errors.APIError):  # gone with another
            client.images.remove(image, force=True)
    still = {i.id for i in client.images.list(filters={"dangling": True})} & new["images"]
    left = {kind: ids for kind, ids in new.items() if ids and kind != "images"}
    assert not left, f"the Docker suite left on the engine: {left}"
    assert not still, f"the Docker suite left untagged images: {still}"


@pytest.fixture(scope="module")
def stack_settings() -> dict[str, str]:
    """What a module's ``.env`` sets beyond the required values (override per module)."""
    return {}


@pytest.fixture(scope="module")
def stack(
    engine: docker.DockerClient,
    tmp_path_factory: pytest.TempPathFactory,
    stack_settings: dict[str, str],
    request: pytest.FixtureRequest,
) -> Iterator[Stack]:
    """The README's compose instructions followed in a fresh checkout."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    folder = tmp_path_factory.mktemp("compose")
    with compose_project(
        engine, folder, name, readme_compose_commands(), stack_settings
    ) as running:
        yield running


@pytest.fixture(scope="module")
def docker_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Docker client config whose CLI has the compose plugin (Harbor runs `docker compose`)."""
    config = tmp_path_factory.mktemp("docker-config")
    (config / "cli-plugins").mkdir()
    (config / "cli-plugins" / "docker-compose").symlink_to(COMPOSE_PLUGIN)
    return config
