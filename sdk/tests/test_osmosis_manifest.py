"""Every public name of upstream ``osmosis-ai`` (v1 0.2.17 and v2 0.3.8) imports through the
``osmosis_ai`` alias from the module path upstream exports it from.

A name either resolves, or (platform-only names we decided not to provide) raises an
``ImportError`` that says why and points at ``docs/COMPATIBILITY.md``.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from osmosis_manifest import V1, V2, names

from rollout_sdk.compat import install_osmosis_alias, uninstall_osmosis_alias

COMPATIBILITY = Path(__file__).parents[2] / "docs" / "COMPATIBILITY.md"

# The manifest's names that belong to the Osmosis platform alone (public-IP detection and the
# host checks upstream's platform registration uses). docs/COMPATIBILITY.md records the
# decision for each.
PLATFORM_ONLY = (
    "PublicIPDetectionError",
    "detect_public_ip",
    "is_private_ip",
    "is_valid_hostname_or_ip",
    "validate_ipv4",
)
# (module, name) pairs we decided not to provide: importing one raises an ImportError that
# says why. None today: every platform-only name has real behaviour.
NOT_PROVIDED: frozenset[tuple[str, str]] = frozenset()

# Names one generation lists in several modules that are deliberately different objects:
# the top level keeps v1's RolloutContext/RolloutStatus/MessageDict (SDK.md "Naming", 1.1),
# and each framework integration has its own placeholder model.
DIFFERENT_OBJECTS = {"RolloutContext", "RolloutStatus", "MessageDict", "OsmosisRolloutModel"}


@pytest.fixture(scope="module", autouse=True)
def alias() -> Iterator[None]:
    assert install_osmosis_alias()
    yield
    uninstall_osmosis_alias()


def resolve(module: str, name: str) -> object:
    """What ``from <module> import <name>`` gives, through the alias."""
    imported = importlib.import_module(module)
    try:
        return getattr(imported, name)
    except AttributeError as exc:
        raise AssertionError(f"cannot import name {name!r} from {module!r}") from exc


@pytest.mark.parametrize(
    ("module", "name"), names(V1, V2), ids=[f"{m}:{n}" for m, n in names(V1, V2)]
)
def test_every_upstream_name_imports_from_its_module(module: str, name: str) -> None:
    if (module, name) in NOT_PROVIDED:
        with pytest.raises(ImportError, match=r"COMPATIBILITY\.md"):
            resolve(module, name)
    else:
        resolve(module, name)


def test_each_platform_only_name_has_a_documented_decision() -> None:
    text = COMPATIBILITY.read_text()
    for name in {*PLATFORM_ONLY, *(name for _, name in NOT_PROVIDED)}:
        assert f"| `{name}` |" in text, name


@pytest.mark.parametrize("generation", [V1, V2], ids=["v1", "v2"])
def test_a_name_one_generation_lists_in_several_modules_is_one_object(
    generation: dict[str, tuple[str, ...]],
) -> None:
    homes: dict[str, list[str]] = defaultdict(list)
    for module, listed in generation.items():
        for name in listed:
            homes[name].append(module)
    for name, modules in homes.items():
        if name in DIFFERENT_OBJECTS or len(modules) < 2:
            continue
        values = [resolve(module, name) for module in modules]
        assert all(value is values[0] for value in values), (name, modules)
