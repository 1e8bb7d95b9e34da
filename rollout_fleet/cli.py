"""``rollout-fleet``: run the fleet's processes, or a whole local fleet with one command, and
look into a running fleet (they read its Redis: ``REDIS_URL``, else the ``up`` running here).

rollout-fleet up --agent examples/calculator/server.py:agent_loop --mock-trainer
rollout-fleet gateway --port 8000 --workers 2
rollout-fleet worker --concurrency 100
rollout-fleet mock-trainer --responder calculator
rollout-fleet probe gateway --port 8000
rollout-fleet status <rollout id>    rollout-fleet ls --status running --older-than 600
rollout-fleet cancel <rollout id>... rollout-fleet export -o trajectories.jsonl
rollout-fleet eval run configs/eval/default.toml --name nightly

Every heavy import (Celery, FastAPI, uvicorn, redis, pydantic-settings, rich, the SDK) sits
in the command that needs it: ``--help`` and a ``status`` start in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from rollout_fleet.startup import (
    check_settings,
    load_agent_or_exit,
    refuse,
    refuse_unready_engine,
    refuse_unsafe_redis,
)
from rollout_sdk.cli import mock_trainer
from rollout_sdk.lazy_group import lazy_group

if TYPE_CHECKING:
    from rich.console import Console

    from rollout_core.store import RecordStore
    from rollout_fleet.evaluation import FleetExecutor
    from rollout_fleet.target import FleetUnreadable
    from rollout_sdk.evaluation.config import EvalConfig
    from rollout_sdk.loader import Agent
    from rollout_sdk.localrun.runner import RunOptions


app = typer.Typer(
    name="rollout-fleet",
    help="Run LLM-agent rollouts on a Celery/Redis worker fleet.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # click's plain help: quick to start, paragraphs rewrapped whole
)
app.command("mock-trainer")(mock_trainer)


def _on_a_fleet(agent: Agent, config: EvalConfig, options: RunOptions) -> FleetExecutor:
    from rollout_fleet.evaluation import FleetExecutor

    return FleetExecutor(agent, config, options)


def _eval_app() -> typer.Typer:
    from rollout_sdk.evaluation.command import eval_app

    return eval_app(
        _on_a_fleet,
        "on a fleet: --fleet, an up running here, or one started",
        "rollout-fleet",
        on_fleet=True,
    )


app.add_typer(
    typer.Typer(),
    name="eval",
    help="Evaluate an agent on a dataset, on a fleet.\n\nThe fleet is --fleet (or the "
    "config's [fleet] gateway_url), a rollout-fleet up running here for the same agent, or "
    "one started for the run.",
    no_args_is_help=True,
    cls=lazy_group(_eval_app),
)
probe = typer.Typer(help="Health probes for orchestrators: exit 0 if healthy, else 1.")
app.add_typer(probe, name="probe")


class _LazyConsole:
    """A rich console made on first use: importing rich would cost every command's start
    (``--help`` included) a good part of its time."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def get(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr)
        return self._console

    def print(self, *objects: Any, **options: Any) -> None:
        self.get().print(*objects, **options)


console = _LazyConsole()
notes = _LazyConsole(stderr=True)  # errors, and what must not mix with output (--json)


def _refuse(problem: FleetUnreadable) -> NoReturn:
    """One line on stderr naming why the fleet cannot be read, with its fix; exit 2."""
    print(problem, file=sys.stderr)
    raise typer.Exit(2)


@probe.command("gateway")
def probe_gateway(
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    host: Annotated[str, typer.Option(help="Gateway host")] = "127.0.0.1",
) -> None:
    """The gateway is ready: its agent loaded and Redis answers (GET /ready)."""
    from rollout_fleet import probe

    key = check_settings().api_key
    try:
        readiness = probe.probe_gateway(
            f"http://{host}:{port}", key.get_secret_value() if key else None
        )
    except probe.ProbeFailed as exc:
        console.print(f"[red]unhealthy:[/red] {exc}")
        raise typer.Exit(1) from exc
    console.print(f"ready: {readiness.workers} workers, {readiness.capacity} slots")


@probe.command("worker")
def probe_worker(
    max_age: Annotated[
        float, typer.Option(help="Seconds since the worker last proved it consumes")
    ] = 30.0,
) -> None:
    """This host's worker is consuming: its liveness file is fresh."""
    from rollout_fleet import probe

    try:
        age = probe.probe_worker(check_settings(), max_age)
    except probe.ProbeFailed as exc:
        console.print(f"[red]unhealthy:[/red] {exc}")
        raise typer.Exit(1) from exc
    console.print(f"consuming (checked in {age:.0f}s ago)")


@app.command()
def gateway(
    host: Annotated[str, typer.Option(help="Interface to bind")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
    workers: Annotated[int, typer.Option(help="Gateway processes sharing the port")] = 1,
    log_level: Annotated[
        str | None, typer.Option(help="uvicorn log level (default: ROLLOUT_FLEET_LOG_LEVEL)")
    ] = None,
) -> None:
    """Run the HTTP gateway: admission, health, metrics.

    It serves the agent named by AGENT (or ROLLOUT_FLEET_AGENT).
    """
    import tempfile

    import uvicorn

    from rollout_core.logs import log_config
    from rollout_core.metrics import MULTIPROC_ENV
    from rollout_core.settings import FleetSettings
    from rollout_gateway.limits import open_bind_refusal

    check_settings()
    settings = FleetSettings()
    refusal = open_bind_refusal(host, settings.api_key is not None, settings.insecure_open_gateway)
    if refusal is not None:
        refuse(refusal)
    # Here, not in uvicorn: a factory that raises is a traceback there (and with --workers,
    # restarted for ever). The app loads it again from the import cache.
    agent = load_agent_or_exit(settings.agent)
    refuse_unsafe_redis(settings, agent.name, admits=True, must_answer=False)
    if workers > 1 and MULTIPROC_ENV not in os.environ:
        # Processes sharing the port share their metrics: any of them answers a scrape.
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="rollout-gateway-metrics-")
    level = log_level or settings.log_level
    uvicorn.run(
        "rollout_gateway.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=level,
        log_config=log_config(level, settings.log_format),
        timeout_keep_alive=75,
        loop="uvloop",
        http="httptools",
    )


@app.command()
def worker(
    concurrency: Annotated[
        int | None, typer.Option(help="Rollouts in flight in this process (default: settings)")
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Celery node name (default: worker-<pid>@<host>)")
    ] = None,
    loglevel: Annotated[
        str | None, typer.Option(help="Celery log level (default: ROLLOUT_FLEET_LOG_LEVEL)")
    ] = None,
) -> None:
    """Run one worker process: it takes rollouts off the queue and runs them on one asyncio loop.

    Celery's worker runs beside it for remote control, heartbeats and Flower's task events.
    """
    check_settings()
    from rollout_core.queue.celery_app import settings
    from rollout_worker.celery_worker import run_worker

    agent = load_agent_or_exit(settings.agent)  # before Celery starts: one line, at once
    refuse_unsafe_redis(settings, agent.name, admits=False, must_answer=False)
    refuse_unready_engine(agent)

    run_worker(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency or settings.concurrency}",
            f"--exclude-queues={settings.queue}",  # taken by the runtime's intake
            "--without-gossip",
            "--without-mingle",
            f"--loglevel={(loglevel or settings.log_level).upper()}",
            f"--hostname={name or f'worker-{os.getpid()}@%h'}",
        ]
    )


@app.command()
def flower(
    port: Annotated[int, typer.Option(help="Port to listen on")] = 5555,
    address: Annotated[str, typer.Option(help="Interface to bind")] = "0.0.0.0",
    purge_offline_workers: Annotated[
        int, typer.Option(help="Seconds after which a stopped worker leaves the dashboard")
    ] = 60,
    max_tasks: Annotated[int, typer.Option(help="Tasks Flower keeps in memory")] = 20_000,
    tasks_columns: Annotated[
        str, typer.Option(help="Columns of the Tasks page (args: the rollout id)")
    ] = "name,args,state,received,started,runtime,worker,uuid",
) -> None:
    """Run the Flower dashboard, behind a login.

    It reads the fleet's Celery config, and refuses to run without FLOWER_BASIC_AUTH
    (user:password) or an OAuth provider (FLOWER_AUTH_PROVIDER).
    """
    check_settings()
    from rollout_core.queue.celery_app import app as celery

    if not (os.environ.get("FLOWER_BASIC_AUTH") or os.environ.get("FLOWER_AUTH_PROVIDER")):
        console.print("[red]set FLOWER_BASIC_AUTH=user:password (or an OAuth provider)[/red]")
        raise typer.Exit(2)
    celery.start(
        [
            "flower",
            f"--port={port}",
            f"--address={address}",
            f"--purge_offline_workers={purge_offline_workers}",
            f"--max_tasks={max_tasks}",
            f"--tasks_columns={tasks_columns}",
        ]
    )


@app.command()
def up(
    agent: Annotated[str, typer.Option("--agent", "-a", help="module:attr or file.py:attr")],
    workers: Annotated[int, typer.Option(help="Worker processes")] = 2,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Rollouts per worker process (default: ROLLOUT_FLEET_WORKER_CONCURRENCY, or 100)"
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(help="Gateway port (default 8000, or a free one if 8000 is busy)"),
    ] = None,
    gateway_workers: Annotated[int, typer.Option(help="Gateway processes sharing its port")] = 1,
    flower: Annotated[bool, typer.Option(help="Run the Flower dashboard")] = True,
    flower_port: Annotated[
        int | None,
        typer.Option(help="Flower port (default 5555, or a free one if 5555 is busy)"),
    ] = None,
    mock_trainer_responder: Annotated[
        str | None,
        typer.Option(
            "--mock-trainer",
            help="Also run a mock TrainGate with this responder: keyword or calculator "
            "(default: none)",
        ),
    ] = None,
    mock_trainer_port: Annotated[
        int | None,
        typer.Option(help="Mock TrainGate port (default 9001, or a free one if 9001 is busy)"),
    ] = None,
) -> None:
    """Run Redis (unless REDIS_URL is set), the gateway, workers and Flower until Ctrl-C,
    SIGTERM or SIGHUP stops them (a second signal kills them at once).

    Ports are checked before anything starts: a port you ask for must be free, else up stops
    and names it; a default port that is busy is replaced by a free one, and up says so.
    Nothing up starts outlives it, even when it is killed. In another terminal,
    rollout-fleet status, ls, cancel and export find this fleet (unless REDIS_URL is set).
    """
    from rollout_fleet.up import UpOptions
    from rollout_fleet.up import up as run_up

    run_up(
        UpOptions(
            agent=agent,
            workers=workers,
            concurrency=concurrency,
            port=port,
            gateway_workers=gateway_workers,
            flower=flower,
            flower_port=flower_port,
            mock_trainer=mock_trainer_responder,
            mock_trainer_port=mock_trainer_port,
        )
    )


def _store_call[T](work: Callable[[RecordStore], Awaitable[T]]) -> T:
    """Run ``work`` against the records of the fleet :func:`rollout_fleet.target.find_target`
    names, once Redis answered (within seconds) and holds that fleet; say which fleet on
    stderr first. Every failure to read it is one line on stderr and exit 2."""
    import asyncio

    from rollout_core.store import RecordStore, StoreError
    from rollout_fleet.target import FleetUnreadable, check_fleet, find_target, unreadable

    try:
        target = find_target(check_settings())
    except FleetUnreadable as problem:
        _refuse(problem)

    async def run() -> T:
        try:
            store = RecordStore.connect(target.settings, max_connections=4, fail_fast=True)
        except ValueError as exc:  # the URL's form
            raise unreadable(exc, target) from None
        try:
            await check_fleet(store, target)
            print(target.describe(), file=sys.stderr, flush=True)
            return await work(store)
        except StoreError as exc:
            raise unreadable(exc, target) from None
        finally:
            await store.aclose()

    try:
        return asyncio.run(run())
    except FleetUnreadable as problem:
        _refuse(problem)


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]


@app.command()
def status(
    rollout_id: Annotated[
        str | None,
        typer.Argument(
            help="Rollout id (v1: or its idempotency key); left out: the fleet at a glance"
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """One rollout's record, or the fleet's figures.

    A rollout: its status, attempts, worker, timings, reward and error. The fleet: live
    workers and their slots, rollouts running, waiting and finished, and sandboxes (slots and
    running) for sandboxed agents.

    Reads the fleet REDIS_URL names (with ROLLOUT_FLEET_KEY_PREFIX), else the rollout-fleet
    up running here, and says which on stderr. Exit 1 if the rollout is unknown, 2 if the
    fleet cannot be read.
    """
    from rollout_core.views import find, fleet

    if rollout_id is None:
        figures = _store_call(fleet)
        if as_json:
            print(figures.model_dump_json(indent=2))
            return
        from rich.table import Table

        overview = Table(show_header=False, title="fleet")
        for name, value in figures.model_dump().items():
            overview.add_row(name.replace("_", " "), str(value))
        console.print(overview)
        return
    view = _store_call(lambda store: find(store, rollout_id))
    if view is None:
        from rich.markup import escape

        console.print(
            f"[red]no rollout[/red] {escape(repr(rollout_id))}: never admitted, or expired"
        )
        raise typer.Exit(1)
    if as_json:
        print(view.model_dump_json(indent=2))
        return
    from rich.table import Table
    from rich.text import Text

    from rollout_sdk.terminal import as_data as shown

    table = Table(show_header=False, title=Text.assemble("rollout ", shown(rollout_id)))
    for name, value in view.model_dump().items():
        table.add_row(name, shown(value))
    console.print(table)


@app.command("ls")
def list_rollouts(
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            "-s",
            help="Keep rollouts in this status, e.g. running (repeatable; default: all)",
        ),
    ] = None,
    older_than: Annotated[
        float | None, typer.Option(help="Admitted at least this many seconds ago (default: any)")
    ] = None,
    newer_than: Annotated[
        float | None, typer.Option(help="Admitted at most this many seconds ago (default: any)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Rollouts to show at most")] = 50,
    as_json: JsonOption = False,
) -> None:
    """The rollouts the fleet holds, newest first.

    Reads the fleet REDIS_URL names (with ROLLOUT_FLEET_KEY_PREFIX), else the rollout-fleet
    up running here, and says which on stderr. Exit 2 if the fleet cannot be read.
    """
    from rollout_core.store import Status
    from rollout_core.views import listing

    unknown = sorted(set(status or ()) - set(Status))
    if unknown:
        statuses = ", ".join(Status)
        print(f"no status {unknown[0]!r}: --status takes one of {statuses}", file=sys.stderr)
        raise typer.Exit(2)

    views = _store_call(
        lambda store: listing(
            store,
            statuses=set(status) if status else None,
            older_than=older_than,
            newer_than=newer_than,
            limit=limit,
        )
    )
    if as_json:
        print(json.dumps([view.model_dump(mode="json") for view in views], indent=2))
        return
    from rollout_fleet.tables import views_table

    width = console.get().width
    table, left_out = views_table(views, width)
    console.print(table)
    note = ""
    if left_out:
        note = f" ({' and '.join(left_out)} left out at {width} columns: widen it, or --json)"
    console.print(f"{len(views)} rollouts{note}", soft_wrap=True)


@app.command()
def cancel(
    rollout_ids: Annotated[list[str], typer.Argument(help="Rollout ids (v1: or idempotency keys)")],
) -> None:
    """Cancel rollouts.

    A queued one never runs, a running one stops (v1: the trainer is told).

    Reads the fleet REDIS_URL names (with ROLLOUT_FLEET_KEY_PREFIX), else the rollout-fleet
    up running here, and says which on stderr. Exit 1 if an id is unknown, 2 if the fleet
    cannot be read.
    """
    from rich.text import Text

    from rollout_core.protocols import cancelled_result
    from rollout_core.store import CancelOutcome
    from rollout_sdk.terminal import as_data as shown

    retention = check_settings().result_retention_seconds

    async def cancel_each(store: RecordStore) -> dict[str, CancelOutcome]:
        dispositions = {}
        for rollout_id in rollout_ids:
            keys = await store.keys_of(rollout_id)
            outcomes = await store.cancel(
                {key: cancelled_result(store.keys, key) for key in keys}, retention
            )
            known = [
                outcome for outcome in outcomes.values() if outcome is not CancelOutcome.UNKNOWN
            ]
            dispositions[rollout_id] = known[0] if known else CancelOutcome.UNKNOWN
        return dispositions

    dispositions = _store_call(cancel_each)
    for rollout_id, disposition in dispositions.items():
        console.print(Text.assemble(shown(rollout_id), f": {disposition}"))
    if CancelOutcome.UNKNOWN in dispositions.values():
        raise typer.Exit(1)


@app.command()
def export(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="JSONL file (default: stdout)")
    ] = None,
) -> None:
    """Export finished rollouts as JSON lines.

    Every finished rollout the fleet still keeps, one line each (its trajectory).

    Reads the fleet REDIS_URL names (with ROLLOUT_FLEET_KEY_PREFIX), else the rollout-fleet
    up running here, and says which on stderr. Exit 2 if the fleet cannot be read, 1 if the
    file cannot be written.
    """
    import asyncio

    from rollout_core.views import trajectories

    async def write_all(store: RecordStore) -> int:
        lines = [json.dumps(line, default=str) + "\n" async for line in trajectories(store)]
        if output is None:
            sys.stdout.writelines(lines)
        else:
            await asyncio.to_thread(output.write_text, "".join(lines), encoding="utf-8")
        return len(lines)

    try:
        written = _store_call(write_all)
    except OSError as exc:
        print(f"cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    if output is not None:
        console.print(f"{written} rollouts written to {output}")


def main() -> None:
    app()


__all__ = ["app", "main"]
