"""A compose stack run as local processes, configured the way a user would: a project
folder holding ``docker-compose.yml`` and a ``.env`` made from ``.env.example``."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rollout_fleet.processes import ManagedProcess, free_port
from rollout_fleet.redis_server import redis_server_binary
from tests.deploy.compose import ComposeAsProcesses
from tests.deploy.dockerfile import ImageBuilder
from tests.harness import REPO

# A user's checkout: everything in the repo but local state.
NOT_IN_A_CHECKOUT = {".env", ".git", ".venv", "test-output", ".mypy_cache", ".ruff_cache"}


def env_file(overrides: dict[str, str]) -> str:
    """``.env.example`` with these values set (added when the example lacks them)."""
    lines, missing = [], dict(overrides)
    for line in (REPO / ".env.example").read_text().splitlines():
        name = line.split("=", 1)[0]
        lines.append(f"{name}={missing.pop(name)}" if "=" in line and name in missing else line)
    return "\n".join([*lines, *(f"{k}={v}" for k, v in missing.items())]) + "\n"


def project(root: Path, overrides: dict[str, str], compose_file: str | None = None) -> Path:
    """A checkout to run compose in: the repo's files (linked), a fresh ``.env`` and,
    optionally, another ``docker-compose.yml``."""
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name in NOT_IN_A_CHECKOUT or entry.name.startswith(".pytest"):
            continue
        if entry.name == "docker-compose.yml" and compose_file is not None:
            (root / entry.name).write_text(compose_file)
        else:
            (root / entry.name).symlink_to(entry)
    (root / ".env").write_text(env_file(overrides))
    return root


@dataclass
class Stack:
    """A running compose stack plus what a test needs to talk to it and to audit it."""

    compose: ComposeAsProcesses
    planted: dict[str, str]
    monitor: ManagedProcess

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.compose.container_port('gateway')}"

    @property
    def flower_url(self) -> str:
        return f"http://127.0.0.1:{self.compose.container_port('flower')}"

    @property
    def flower_login(self) -> tuple[str, str]:
        user, _, password = self.planted["FLOWER_BASIC_AUTH"].partition(":")
        return user, password

    def redis(self) -> redis.Redis:
        port = self.compose.services["redis"]["environment"]["REDIS_PORT"]
        return redis.Redis(
            port=int(port), password=self.planted["REDIS_PASSWORD"], decode_responses=True
        )

    def gateway(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.gateway_url,
            timeout=60,
            headers={"Authorization": f"Bearer {self.planted['ROLLOUT_FLEET_API_KEY']}"},
        )

    def flower(self, auth: bool = True) -> httpx.Client:
        return httpx.Client(
            base_url=self.flower_url, timeout=30, auth=self.flower_login if auth else None
        )

    def flower_tasks(self) -> dict[str, dict[str, Any]]:
        """Flower's task list (``/api/tasks``): uuid → name, args, state, worker..."""
        with self.flower() as flower:
            response = flower.get("/api/tasks", params={"limit": 10_000})
        response.raise_for_status()
        tasks: dict[str, dict[str, Any]] = response.json()
        return tasks

    def leaks(self, secrets: dict[str, str]) -> list[str]:
        """Where any of ``secrets`` (name → value) shows: the services' logs, every command
        Redis executed (records, Lua arguments, broker messages), every key left in Redis,
        and Flower's task list. Asserts first that the Redis capture saw rollout messages."""
        time.sleep(1)  # let the last log lines and MONITOR output reach their files
        commands = self.monitor.output()
        assert '"task": "rollout.run"' in commands.replace('\\"', '"'), "MONITOR saw no message"
        places = {
            "service logs": self.compose.all_logs(),
            "Redis commands": commands,
            "Redis keys and values": redis_dump(self.redis()),
            "Flower's task list": json.dumps(self.flower_tasks()),
        }
        return [
            f"{name} in {place}"
            for place, text in places.items()
            for name, secret in secrets.items()
            if secret in text
        ]


def redis_dump(store: redis.Redis) -> str:
    """Every key with its value, whatever its type."""
    readers: dict[str, Callable[[str], Any]] = {
        "string": store.get,
        "hash": store.hgetall,
        "list": lambda key: store.lrange(key, 0, -1),
        "set": store.smembers,
        "zset": lambda key: store.zrange(key, 0, -1, withscores=True),
    }
    lines = []
    for key in store.scan_iter(count=1000):
        kind = store.type(key)
        lines.append(f"{key} {kind} {readers[kind](key)}" if kind in readers else f"{key} {kind}")
    return "\n".join(lines)


def planted_secrets() -> dict[str, str]:
    """Secrets a deployment holds, each unique enough to grep for."""
    return {
        "REDIS_PASSWORD": f"plantedredis{secrets.token_hex(8)}",
        "FLOWER_BASIC_AUTH": f"admin:planted-flower-{secrets.token_hex(8)}",
        "ROLLOUT_FLEET_API_KEY": f"planted-server-key-{secrets.token_hex(8)}",
        "TRAINER_API_KEY": f"planted-trainer-key-{secrets.token_hex(8)}",  # sent in requests
    }


@pytest.fixture(scope="module")
def stack_settings() -> dict[str, str]:
    """What this module's ``.env`` sets beyond the secrets (override per module)."""
    return {}


@pytest.fixture(scope="session")
def image_builder(tmp_path_factory: pytest.TempPathFactory) -> ImageBuilder:
    """Builds each image's virtualenv once per session."""
    return ImageBuilder(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    stack_settings: dict[str, str],
    image_builder: ImageBuilder,
) -> Iterator[Stack]:
    planted = planted_secrets()
    ports = {name: str(free_port()) for name in ("GATEWAY_PORT", "FLOWER_PORT", "REDIS_PORT")}
    settings = {
        **{k: v for k, v in planted.items() if k != "TRAINER_API_KEY"},
        **ports,
        **stack_settings,
    }
    root = tmp_path_factory.mktemp("compose")
    compose = ComposeAsProcesses(project(root / "project", settings), root / "run", image_builder)
    compose.up("redis")
    cli = Path(redis_server_binary()).parent / "redis-cli"
    monitor = ManagedProcess(
        "redis-monitor",
        [str(cli), "-p", ports["REDIS_PORT"], "monitor"],
        {"REDISCLI_AUTH": planted["REDIS_PASSWORD"]},
        root / "run" / "logs" / "redis-monitor.log",
    ).start()
    try:
        compose.up()
        yield Stack(compose, planted, monitor)
    finally:
        compose.down()
        monitor.stop()
