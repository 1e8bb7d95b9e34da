"""The Lua scripts use the vocabulary ``rollout_core/store/schema.py`` defines, and only it.

Lua reads a missing table entry as ``nil`` without complaint, so a misspelt ``FIELD.staus``
would silently write nothing: every name a script looks up must exist in its Python enum.
And a script that spelt ``'queued'`` or ``':leases'`` itself would be a second definition of
a fact the schema owns.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import redis

from rollout_core.store.schema import LUA_SETS, LUA_VOCABULARY, Keys, lua_prelude
from rollout_core.store.scripts import PRELUDE, Script
from rollout_fleet.redis_server import RedisServer

LUA = Path(str(resources.files("rollout_core.store") / "lua"))
SCRIPTS = sorted(LUA.glob("*.lua"))
LOOKUP = re.compile(r"\b([A-Z_]+)\.([a-z_0-9]+)\b")
STRING = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def code(path: Path) -> str:
    """The script without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_every_name_a_script_looks_up_is_defined(path: Path) -> None:
    for table, name in LOOKUP.findall(code(path)):
        assert table in LUA_VOCABULARY, f"{path.name}: unknown table {table}"
        assert name in {member.value for member in LUA_VOCABULARY[table]}, (
            f"{path.name}: {table}.{name} is not in {LUA_VOCABULARY[table].__name__}"
        )


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_no_script_spells_the_vocabulary_itself(path: Path) -> None:
    words = {member.value for enum in LUA_VOCABULARY.values() for member in enum}
    key_names = {key.split(":", 1)[-1] for key in Keys("p").lua_names().values()}
    for single, double in STRING.findall(code(path)):
        literal = single or double
        assert literal not in words, f"{path.name} spells {literal!r}: use the schema's table"
        assert not any(name and name in literal for name in key_names if name != "v2:"), (
            f"{path.name} spells a key ({literal!r}): use the prelude's name for it"
        )


def test_the_prelude_declares_every_table_and_set() -> None:
    prelude = lua_prelude(Keys("rf"))
    for name in [*LUA_VOCABULARY, *LUA_SETS, *Keys("rf").lua_names()]:
        assert re.search(rf"^local {name} = ", prelude, re.MULTILINE), name
    assert 'local LEASES = "rf:leases"' in prelude
    assert 'local TERMINAL = {["cancelled"] = true, ["failure"] = true' in prelude


def test_every_script_compiles_with_its_prelude(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url_for(1002))
    prelude = lua_prelude(Keys("rf")) + (LUA / "_prelude.lua").read_text()
    try:
        for path in SCRIPTS:
            if not path.name.startswith("_"):
                assert client.script_load(prelude + path.read_text()), path.name
    finally:
        client.close()


def test_every_script_file_is_a_member_of_the_script_enum_and_back() -> None:
    """A script is called by its ``Script`` member: a file without one is never run, and a
    member without its file fails when the store starts."""
    files = {path.name for path in SCRIPTS if path != Path(str(PRELUDE))}
    assert files == {script.file.name for script in Script}
    assert all(script.file.is_file() for script in Script)
