"""Refusing to start, in one line: what ``rollout-fleet gateway``, ``worker`` and ``up`` check
before they run (settings, the agent, Redis), and how they say no.

All three use these, so a mistake reads the same whichever meets it: one line on stderr naming
the problem and its fix, a non-zero exit, never a traceback (a newcomer reads the first line
of a log, and a supervisor restarting a process that fails its start learns nothing from a
traceback). No line shows a setting's value: a Redis URL or a key may hold a secret.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.console import Console

    from rollout_core.settings import FleetSettings
    from rollout_sdk.loader import Agent


@cache
def errors() -> Console:
    """Where refusals go. Made on first use: importing rich would cost every command's start
    (``--help`` included). soft_wrap: a line stays one line in a log file (rich wraps at 80
    columns off a terminal)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


SETTINGS_REFUSED = 2  # the exit code of a start refused for its configuration


def refuse(message: str, code: int = SETTINGS_REFUSED) -> NoReturn:
    """Print ``message`` as one line of text (an exception's message may span several) and
    exit with ``code``."""
    errors().print(" ".join(message.split("\n")), style="red", markup=False)
    raise typer.Exit(code)


def _settings_lines(exc: ValidationError, env_prefix: str) -> list[str]:
    """One line per invalid setting, naming its variable and never its value."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = error["loc"]  # (the field, then a place within its value)
        field = f"{env_prefix}{str(loc[0]).upper()}: " if loc else ""
        lines.append(f"invalid setting {field}{error['msg']}")
    return lines


def check_settings() -> FleetSettings:
    """The fleet's settings (``ROLLOUT_FLEET_*``) and the SDK's (``OSMOSIS_ROLLOUT_*``), or a
    line per invalid one and exit 2."""
    from pydantic import ValidationError

    from rollout_core.settings import FleetSettings
    from rollout_sdk.config.settings import (
        RolloutClientSettings,
        RolloutServerSettings,
        RolloutSettings,
        get_settings,
    )

    try:
        settings = FleetSettings()
    except ValidationError as exc:
        lines = _settings_lines(exc, "ROLLOUT_FLEET_")
    else:
        try:
            get_settings()
        except ValidationError as exc:
            # A nested group's error names its own class: its variables have its prefix.
            groups = (RolloutSettings, RolloutClientSettings, RolloutServerSettings)
            prefixes = {group.__name__: group.model_config.get("env_prefix") for group in groups}
            lines = _settings_lines(exc, prefixes.get(exc.title) or "OSMOSIS_ROLLOUT_")
        else:
            return settings
    for line in lines[:-1]:
        errors().print(line, style="red", markup=False)
    refuse(lines[-1])


def load_agent_or_exit(reference: str | None) -> Agent:
    """The agent ``reference`` names, or one line saying why it cannot load, and exit 1."""
    from rollout_sdk.loader import AgentLoadError, load_agent

    if not reference:
        refuse("no agent configured: set AGENT (or ROLLOUT_FLEET_AGENT) to module:attr")
    try:
        return load_agent(reference)
    except AgentLoadError as exc:
        refuse(f"cannot load the agent {reference!r}: {exc}", code=1)


def redis_location(url: str) -> str:
    """Where a Redis URL points, without its credentials."""
    return url.rsplit("@", maxsplit=1)[-1]


def refuse_unsafe_redis(
    settings: FleetSettings, agent: str, *, admits: bool, must_answer: bool
) -> None:
    """Refuse, in one line, a Redis that can lose admitted rollouts, whose queue another fleet
    uses, or values the fleet's live processes do not share (``agent``: its name), or (for a
    process that ``admits``) that lacks the replicas admissions wait for
    (``rollout_core.durability.start_checks``). A process checks again as it starts; this
    spares the operator its wait. A Redis that does not answer now is refused if it
    ``must_answer`` (``up``, about to start a fleet on it), else left to that check (a
    container may start before its Redis)."""
    import asyncio

    from rollout_core.durability import Agreement, StartRefused, start_checks
    from rollout_core.secrets import check_key_canary, load_secret_box
    from rollout_core.store import RecordStore, answers
    from rollout_fleet.target import FleetTarget, unreadable, url_source

    try:
        answered = answers(settings.redis_dsn)
    except ValueError as exc:  # not a Redis URL at all
        refuse(str(unreadable(exc, FleetTarget(settings, url_source(settings)))))
    if not answered:
        if must_answer:
            refuse(
                f"Redis at {redis_location(settings.redis_dsn)} does not answer: start it, fix "
                "REDIS_URL, or unset REDIS_URL to let rollout-fleet up run its own"
            )
        return

    async def check() -> None:
        store = RecordStore.connect(settings, max_connections=2)
        try:
            agreement = Agreement.of(store, settings, agent, admits=admits)
            await start_checks(store, settings, agreement, admits=admits)
            if not admits:  # a worker: it must open what the gateways seal
                await check_key_canary(store, await load_secret_box(store, settings, quiet=True))
        finally:
            await store.aclose()

    try:
        asyncio.run(check())
    except StartRefused as exc:
        refuse(str(exc))


def refuse_unready_engine(agent: object) -> None:
    """Refuse, in one line, a sandboxed agent on a host whose engine cannot run its
    sandboxes (no docker CLI, no compose plugin, no engine answering): every rollout would
    fail otherwise. Other agents pass."""
    import asyncio

    from rollout_sdk.backend.sandboxed import SandboxedBackend

    if not isinstance(agent, SandboxedBackend):
        return
    from rollout_sdk.backend.harbor.engine import EngineError

    try:
        asyncio.run(agent.check_engine())
    except EngineError as exc:
        refuse(f"the agent runs rollouts in sandboxes, and {exc}")


__all__ = [
    "SETTINGS_REFUSED",
    "check_settings",
    "errors",
    "load_agent_or_exit",
    "redis_location",
    "refuse",
    "refuse_unready_engine",
    "refuse_unsafe_redis",
]
