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
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rollout_fleet import state
from rollout_fleet.startup import check_settings, load_agent_or_exit, refuse, refuse_unsafe_redis
from rollout_sdk.cli import mock_trainer
from rollout_sdk.evaluation.command import eval_app

if TYPE_CHECKING:
    from rollout_core.settings import FleetSettings
    from rollout_core.store import RecordStore
    from rollout_core.views import RolloutView
    from rollout_fleet.evaluation import FleetExecutor
    from rollout_sdk.evaluation.config import EvalConfig
    from rollout_sdk.loader import Agent
    from rollout_sdk.localrun.runner import RunOptions

T = TypeVar("T")

app = typer.Typer(
    name="rollout-fleet",
    help="Run LLM-agent rollouts on a Celery/Redis worker fleet.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("mock-trainer")(mock_trainer)


def _on_a_fleet(agent: Agent, config: EvalConfig, options: RunOptions) -> FleetExecutor:
    from rollout_fleet.evaluation import FleetExecutor

    return FleetExecutor(agent, config, options)


app.add_typer(eval_app(_on_a_fleet, "on a fleet: [fleet] gateway_url, or one started"), name="eval")
probe = typer.Typer(help="Health probes for orchestrators: exit 0 if healthy, else 1.")
app.add_typer(probe, name="probe")
console = Console()
notes = Console(stderr=True)  # what must not mix with a command's output (--json)


@probe.command("gateway")
def probe_gateway(
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    host: Annotated[str, typer.Option(help="Gateway host")] = "127.0.0.1",
) -> None:
    """The gateway is ready: its agent loaded and Redis answers (GET /ready)."""
    from rollout_core.settings import FleetSettings
    from rollout_fleet import probe

    key = FleetSettings().api_key
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
    from rollout_core.settings import FleetSettings
    from rollout_fleet import probe

    try:
        age = probe.probe_worker(FleetSettings(), max_age)
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
    """Run the HTTP gateway (admission, health, metrics) for the agent named by AGENT."""
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
    refuse_unsafe_redis(settings, admits=True, must_answer=False)
    # Here, not in uvicorn: a factory that raises is a traceback there (and with --workers,
    # restarted for ever). The app loads it again from the import cache.
    load_agent_or_exit(settings.agent)
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
    """Run one worker process: a Celery consumer driving rollouts on one asyncio loop."""
    check_settings()
    from rollout_core.queue.celery_app import settings
    from rollout_worker.tasks import run_worker

    refuse_unsafe_redis(settings, admits=False, must_answer=False)
    load_agent_or_exit(settings.agent)  # before Celery starts: one line, at once

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
    """Run the Flower dashboard on the fleet's Celery config; refuses to run without a login."""
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
    concurrency: Annotated[int | None, typer.Option(help="Rollouts per worker process")] = None,
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
        typer.Option("--mock-trainer", help="Also run a mock TrainGate (keyword|calculator)"),
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


def _fleet_settings() -> FleetSettings:
    """The settings of the fleet the CLI looks into: ``REDIS_URL``'s, else those of the
    newest ``rollout-fleet up`` this user runs (its Redis and key prefix)."""
    from pydantic import SecretStr

    settings = check_settings()
    if "redis_url" in settings.model_fields_set:
        return settings
    fleets = state.running()
    if not fleets:
        return settings
    if len(fleets) > 1:
        pids = ", ".join(str(fleet.pid) for fleet in fleets)
        notes.print(
            f"{len(fleets)} rollout-fleet up are running (pids {pids}): looking into the "
            f"newest (pid {fleets[0].pid}); set REDIS_URL to choose",
            soft_wrap=True,
        )
    update: dict[str, object] = {"redis_url": SecretStr(fleets[0].redis_url)}
    if "key_prefix" not in settings.model_fields_set:
        update["key_prefix"] = fleets[0].key_prefix
    return settings.model_copy(update=update)


def _store_call(work: Callable[[RecordStore], Awaitable[T]]) -> T:
    """Run ``work`` against the fleet's records (``REDIS_URL``, ``ROLLOUT_FLEET_KEY_PREFIX``;
    unset, those of the ``rollout-fleet up`` running here)."""
    from rollout_core.store import RecordStore

    settings = _fleet_settings()

    async def run() -> T:
        store = RecordStore.connect(settings, max_connections=4)
        try:
            return await work(store)
        finally:
            await store.aclose()

    return asyncio.run(run())


def _shown(value: object) -> Text:
    """A value from a record, shown as data: never read as markup, control characters as
    escapes (an admitted id may hold anything; the operator's terminal must not obey it)."""
    text = "" if value is None else str(value)
    return Text(
        "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    )


def _views_table(views: list[RolloutView]) -> Table:
    table = Table(show_header=True)
    for column in ("rollout", "protocol", "status", "attempt", "worker", "age s", "run s", "error"):
        table.add_column(column)
    for view in views:
        table.add_row(
            _shown(view.rollout_id),
            view.protocol,
            view.status,
            str(view.attempt),
            _shown(view.worker),
            f"{view.age_seconds:.1f}",
            "" if view.run_seconds is None else f"{view.run_seconds:.2f}",
            _shown((view.error or "")[:60]),
        )
    return table


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]


@app.command()
def status(
    rollout_id: Annotated[str, typer.Argument(help="Rollout id (v1: its idempotency key)")],
    as_json: JsonOption = False,
) -> None:
    """One rollout's record: status, attempts, worker, timings, reward, error."""
    from rollout_core.views import find

    view = _store_call(lambda store: find(store, rollout_id))
    if view is None:
        console.print(
            f"[red]no rollout[/red] {escape(repr(rollout_id))}: never admitted, or expired"
        )
        raise typer.Exit(1)
    if as_json:
        print(view.model_dump_json(indent=2))
        return
    table = Table(show_header=False, title=Text.assemble("rollout ", _shown(rollout_id)))
    for name, value in view.model_dump().items():
        table.add_row(name, _shown(value))
    console.print(table)


@app.command("ls")
def list_rollouts(
    status: Annotated[
        list[str] | None, typer.Option("--status", "-s", help="Keep this status (repeatable)")
    ] = None,
    older_than: Annotated[float | None, typer.Option(help="Admitted at least s ago")] = None,
    newer_than: Annotated[float | None, typer.Option(help="Admitted at most s ago")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    as_json: JsonOption = False,
) -> None:
    """The rollouts the fleet holds, newest first."""
    from rollout_core.views import listing

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
    console.print(_views_table(views))
    console.print(f"{len(views)} rollouts")


@app.command()
def cancel(
    rollout_ids: Annotated[list[str], typer.Argument(help="Rollout ids (v1: idempotency keys)")],
) -> None:
    """Cancel rollouts: a queued one never runs, a running one stops (v1: the trainer is told)."""
    from rollout_core.protocols import cancelled_result
    from rollout_core.settings import FleetSettings
    from rollout_core.store import PROTOCOLS, CancelOutcome

    retention = FleetSettings().result_retention_seconds

    async def cancel_each(store: RecordStore) -> dict[str, CancelOutcome]:
        dispositions = {}
        for rollout_id in rollout_ids:
            keys = [store.keys.record(protocol, rollout_id) for protocol in PROTOCOLS]
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
        console.print(Text.assemble(_shown(rollout_id), f": {disposition}"))
    if CancelOutcome.UNKNOWN in dispositions.values():
        raise typer.Exit(1)


@app.command()
def export(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="JSONL file (default: stdout)")
    ] = None,
) -> None:
    """Every finished rollout the fleet still keeps, one JSON line each (its trajectory)."""
    from rollout_core.views import trajectories

    async def write_all(store: RecordStore) -> int:
        lines = [json.dumps(line, default=str) + "\n" async for line in trajectories(store)]
        if output is None:
            sys.stdout.writelines(lines)
        else:
            await asyncio.to_thread(output.write_text, "".join(lines), encoding="utf-8")
        return len(lines)

    written = _store_call(write_all)
    if output is not None:
        console.print(f"{written} rollouts written to {output}")


def main() -> None:
    app()


__all__ = ["app", "main"]
