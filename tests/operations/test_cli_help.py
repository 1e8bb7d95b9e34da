"""Both command lines explain themselves: every option and argument of every command has help
text, an option left out says what it defaults to, and help at 80 columns wraps its paragraphs
whole (a line ends only where the next word would not fit)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
import typer
from typer._click import Command, Context
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.main import get_command
from typer.testing import CliRunner

from rollout_fleet.cli import app as fleet_app
from rollout_sdk.cli import app as sdk_app

APPS = {"rollout-fleet": fleet_app, "rollout-sdk": sdk_app}


def commands() -> Iterator[tuple[str, typer.Typer, list[str], Command]]:
    """(shown path, app, argv path, command) for every command and group of both CLIs."""
    for name, app in APPS.items():
        root = get_command(app)
        pending: list[tuple[list[str], Command]] = [([], root)]
        while pending:
            path, command = pending.pop()
            yield " ".join([name, *path]), app, path, command
            if isinstance(command, TyperGroup):
                context = Context(command)
                for sub in command.list_commands(context):
                    found = command.get_command(context, sub)
                    assert found is not None
                    pending.append(([*path, sub], found))


ALL = sorted(commands(), key=lambda entry: entry[0])


@pytest.mark.parametrize(
    "command",
    [pytest.param(entry[3], id=entry[0]) for entry in ALL],
)
def test_every_option_and_argument_has_help(command: Command) -> None:
    assert command.help, "the command has no help text"
    unexplained = [
        param.name
        for param in command.params
        if isinstance(param, (TyperOption, TyperArgument)) and not getattr(param, "help", None)
    ]
    assert unexplained == []
    # an option whose default is None shows none: its help says what leaving it out means
    silent = [
        param.name
        for param in command.params
        if isinstance(param, TyperOption)
        and param.default is None
        and not param.required
        and not param.is_flag
        and not param.multiple
        and "default" not in (param.help or "")
    ]
    assert silent == []


def test_the_walk_reaches_every_command() -> None:
    shown = {entry[0] for entry in ALL}
    assert {
        "rollout-fleet status",
        "rollout-fleet ls",
        "rollout-fleet cancel",
        "rollout-fleet export",
        "rollout-fleet up",
        "rollout-fleet probe gateway",
        "rollout-fleet eval run",
        "rollout-sdk serve",
        "rollout-sdk eval run",
    } <= shown


def paragraphs(help_text: str) -> list[list[str]]:
    """The description paragraphs of a command's help: after the usage, before the first
    section (``Options:``, ``Arguments:``, ``Commands:``); each a list of its lines."""
    body = help_text.split("\n\n", 1)[1]
    found: list[list[str]] = []
    for block in body.split("\n\n"):
        if re.match(r"^[A-Z][a-z]+:$", block.splitlines()[0]):
            break
        found.append(block.splitlines())
    return found


@pytest.mark.parametrize("entry", [pytest.param(entry, id=entry[0]) for entry in ALL])
def test_help_at_80_columns_wraps_only_where_the_next_word_does_not_fit(
    entry: tuple[str, typer.Typer, list[str], Command],
) -> None:
    _, app, path, _ = entry
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    described = paragraphs(result.output)
    assert described, result.output
    for paragraph in described:
        for line, following in itertools.pairwise(paragraph):
            next_word = following.split()[0]
            # click wraps help to 78 columns of an 80-column terminal
            assert len(line) + 1 + len(next_word) > 78, (line, following)
