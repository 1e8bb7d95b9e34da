"""A command group whose commands are imported when first used, not when the CLI starts.

``rollout-sdk`` and ``rollout-fleet`` both carry the ``eval`` group, whose module imports
rich, the eval config and their dependencies. Registered eagerly, every call of either
CLI (``--help`` included) pays for them. A :func:`lazy_group` builds the group from its
Typer app only when a command line names it (or its help lists its commands).
"""

from __future__ import annotations

from collections.abc import Callable

import typer
from typer._click import Command, Context  # the click Typer vendors (its groups' types)
from typer.core import TyperGroup
from typer.main import get_group


def lazy_group(load: Callable[[], typer.Typer]) -> type[TyperGroup]:
    """A ``cls`` for ``Typer.add_typer``: the group's commands are those of the Typer app
    ``load`` returns, called once, the first time one is looked up. Its help text is the one
    given to ``add_typer`` (what the parent's command list shows without loading it)."""

    class LazyGroup(TyperGroup):
        _loaded: TyperGroup | None = None

        def _group(self) -> TyperGroup:
            if self._loaded is None:
                loaded = load()
                loaded.rich_markup_mode = self.rich_markup_mode  # format its help like ours
                self._loaded = get_group(loaded)
            return self._loaded

        def list_commands(self, ctx: Context) -> list[str]:
            return self._group().list_commands(ctx)

        def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
            return self._group().get_command(ctx, cmd_name)

    return LazyGroup


__all__ = ["lazy_group"]
