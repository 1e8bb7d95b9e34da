"""``rollout-fleet``: run the fleet's processes, or a whole local fleet with one command.

rollout-fleet up --agent examples/calculator/server.py:agent_loop --mock-trainer
rollout-fleet gateway --port 8000 --workers 2
rollout-fleet worker --concurrency 100
rollout-fleet mock-trainer --responder calculator
rollout-fleet probe gateway --port 8000
"""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer
from rollout_sdk.cli import mock_trainer

app = typer.Typer(
    name="rollout-fleet",
    help="Run LLM-agent rollouts on a Celery/Redis worker fleet.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("mock-trainer")(mock_trainer)
probe = typer.Typer(help="Health probes for orchestrators: exit 0 if healthy, else 1.")
app.add_typer(probe, name="probe")
console = Console()


@probe.command("gateway")
def probe_gateway(
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    host: Annotated[str, typer.Option(help="Gateway host")] = "127.0.0.1",
) -> None:
    """The gateway is ready: its agent loaded and Redis answers (GET /ready)."""
    from rollout_fleet import probe
    from rollout_worker.settings import FleetSettings

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
    from rollout_fleet import probe
    from rollout_worker.settings import FleetSettings

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
    """Run the HTTP gateway (admission, health) for the agent named by AGENT."""
    import uvicorn

    from rollout_worker.settings import FleetSettings

    uvicorn.run(
        "rollout_gateway.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level or FleetSettings().log_level,
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
    from rollout_worker.celery_app import app as celery
    from rollout_worker.celery_app import settings

    celery.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency or settings.concurrency}",
            "--prefetch-multiplier=1",
            f"--queues={settings.queue}",
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
    from rollout_worker.celery_app import app as celery

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


def _print_fleet(fleet: LocalFleet, redis_url: str) -> None:
    table = Table(title="Rollout Fleet is up", show_header=True)
    table.add_column("service")
    table.add_column("where")
    table.add_row("gateway", fleet.gateway_url)
    table.add_row("workers", f"{fleet.workers} processes")
    if fleet.flower:
        user, _, password = fleet.flower_auth.partition(":")
        table.add_row("flower", f"{fleet.flower_url}  (user {user}, password {password})")
    if fleet.mock_trainer:
        table.add_row("mock TrainGate", fleet.mock_trainer_url)
    table.add_row("redis", redis_url.rsplit("@", maxsplit=1)[-1])
    table.add_row("logs", str(fleet.log_dir))
    console.print(table)
    if fleet.mock_trainer:
        path, body, result = fleet.sample_request()
        console.print("Send a rollout:")
        console.print(
            f"  curl -s -X POST {fleet.gateway_url}{path} "
            f"-H 'Content-Type: application/json' -d '{body}'",
            soft_wrap=True,
        )
        if path == "/rollout":
            console.print(
                "Its result (with the polling_lease_token from the answer):\n"
                f"  curl -s {result} -H 'X-Osmosis-Rollout-Lease: <token>'",
                soft_wrap=True,
            )
        else:
            console.print(f"Its result:\n  curl -s {result}")
    console.print("Press Ctrl-C to stop.")


@app.command()
def up(
    agent: Annotated[str, typer.Option("--agent", "-a", help="module:attr or file.py:attr")],
    workers: Annotated[int, typer.Option(help="Worker processes")] = 2,
    concurrency: Annotated[int | None, typer.Option(help="Rollouts per worker process")] = None,
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    flower: Annotated[bool, typer.Option(help="Run the Flower dashboard")] = True,
    flower_port: Annotated[int, typer.Option(help="Flower port")] = 5555,
    mock_trainer_responder: Annotated[
        str | None,
        typer.Option("--mock-trainer", help="Also run a mock TrainGate (keyword|calculator)"),
    ] = None,
    mock_trainer_port: Annotated[int, typer.Option(help="Mock TrainGate port")] = 9001,
) -> None:
    """Run Redis (unless REDIS_URL is set), the gateway, workers and Flower until Ctrl-C."""
    redis_server = None
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        redis_server = RedisServer().start()
        redis_url = redis_server.url
    fleet = LocalFleet(
        agent=agent,
        redis_url=redis_url,
        workers=workers,
        concurrency=concurrency,
        flower=flower,
        mock_trainer=mock_trainer_responder,
        gateway_port=port,
        flower_port=flower_port,
        mock_trainer_port=mock_trainer_port,
    )
    try:
        fleet.start()
        _print_fleet(fleet, redis_url)
        dead: list[str] = []
        while not dead:
            time.sleep(0.5)
            for name in fleet.restart_dead_workers():
                console.print(f"[yellow]{name} exited; restarted it[/yellow]")
            dead = [p.name for p in fleet.processes.values() if not p.alive()]
        console.print(f"[red]{', '.join(dead)} stopped; shutting the fleet down[/red]")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        console.print("stopping...")
    except (TimeoutError, RuntimeError) as exc:
        console.print(f"[red]the fleet did not start: {exc}[/red]")
        raise typer.Exit(1) from exc
    finally:
        fleet.stop()
        if redis_server is not None:
            redis_server.stop()


def main() -> None:
    app()


__all__ = ["app", "main"]
