"""``rollout-fleet up``: Redis, the gateway, workers and Flower (and a mock TrainGate) on this
machine with one command, for a newcomer's first hour.

Before it starts anything it checks what it can (the settings, every option, the ports, the
agent, a Redis it is given) and stops at the first mistake with one line naming it and the
fix. While the fleet starts it prints a line per part that is ready; a process that exits
meanwhile stops it at once, with that process's last log line and its log's path (it will not
become ready: waiting for it would only hide why). Ctrl-C, SIGTERM and SIGHUP stop the fleet in
order (a second one kills what is left), and the last line says it stopped.

Every process logs to the run's folder (``rollout_fleet.logdirs``: the newest few are kept),
which ``up`` names as it starts. Nothing it starts outlives it (``rollout_fleet.reaper``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from rollout_fleet import logdirs, state
from rollout_fleet.local import ChildExited, LocalFleet
from rollout_fleet.processes import bind_error, free_port
from rollout_fleet.reaper import Reaper
from rollout_fleet.redis_server import RedisServer
from rollout_fleet.startup import (
    check_settings,
    errors,
    load_agent_or_exit,
    redis_location,
    refuse,
    refuse_unready_engine,
    refuse_unsafe_redis,
)

if TYPE_CHECKING:
    from rollout_core.settings import FleetSettings

console = Console(soft_wrap=True, highlight=False, emoji=False)

START_TIMEOUT_SECONDS = 120.0  # a loaded 2-core machine took 58 s; a process that exits ends it
STOPPED = "stopped"


@dataclass(frozen=True)
class UpOptions:
    """``up``'s command line."""

    agent: str
    workers: int = 2
    concurrency: int | None = None
    port: int | None = None
    gateway_workers: int = 1
    flower: bool = True
    flower_port: int | None = None
    mock_trainer: str | None = None
    mock_trainer_port: int | None = None


@dataclass(frozen=True)
class Ports:
    gateway: int
    flower: int
    mock_trainer: int


def _check_counts(options: UpOptions) -> None:
    if options.workers < 0:
        refuse(f"--workers {options.workers} is negative: give 0 or more worker processes")
    if options.gateway_workers < 1:
        refuse(f"--gateway-workers {options.gateway_workers}: give 1 or more gateway processes")
    if options.concurrency is not None and options.concurrency < 1:
        refuse(f"--concurrency {options.concurrency}: give 1 or more rollouts per worker")


def _check_mock_trainer(responder: str | None) -> None:
    from rollout_sdk.testing.responders import RESPONDERS

    if responder is not None and responder not in RESPONDERS:
        refuse(
            f"--mock-trainer {responder!r} is not a mock TrainGate responder: choose one of "
            f"{', '.join(sorted(RESPONDERS))}"
        )


def _check_port_range(option: str, asked: int | None) -> None:
    if asked is not None and not 1 <= asked <= 65535:
        refuse(
            f"{option} {asked} is not a port: choose one from 1 to 65535, or leave {option} "
            "out to take a free one"
        )


def _choose_port(service: str, asked: int | None, default: int, taken: set[int]) -> int:
    """The port ``service`` will listen on, chosen before anything starts. A port asked for is
    that port or nothing: when it is busy (or this user may not listen on it), ``up`` stops,
    naming it. Otherwise ``default``, or a free port if it is busy (said so)."""
    if asked is not None:
        problem = OSError("asked twice") if asked in taken else bind_error(asked)
        if isinstance(problem, PermissionError):
            refuse(
                f"port {asked} ({service}) is privileged: choose one above 1023, or leave the "
                "option out to take a free one; nothing was started"
            )
        if problem is not None:
            refuse(
                f"port {asked} ({service}) is in use: free it, choose another, or leave the "
                "option out to take a free one; nothing was started"
            )
        taken.add(asked)
        return asked
    port = default
    while port in taken or bind_error(port) is not None:
        port = free_port()
    if port != default:
        console.print(f"port {default} is in use: {service} listens on {port}", style="yellow")
    taken.add(port)
    return port


def _preflight(options: UpOptions) -> tuple[FleetSettings, Ports]:
    """Everything ``up`` can check before it starts a process, in one line each (exit 2, or 1
    for an agent that does not load)."""
    _check_counts(options)
    for option, asked in (
        ("--port", options.port),
        ("--flower-port", options.flower_port),
        ("--mock-trainer-port", options.mock_trainer_port),
    ):
        _check_port_range(option, asked)
    _check_mock_trainer(options.mock_trainer)
    settings = check_settings()
    taken: set[int] = set()  # ports asked for are placed first: a default never takes one
    gateway = _choose_port("the gateway", options.port, 8000, taken)
    flower = _choose_port("Flower", options.flower_port, 5555, taken) if options.flower else 0
    trainer = 0
    if options.mock_trainer is not None:
        trainer = _choose_port("the mock TrainGate", options.mock_trainer_port, 9001, taken)
    agent = load_agent_or_exit(options.agent)  # as the gateway and the workers will
    refuse_unready_engine(agent)
    if "redis_url" in settings.model_fields_set:  # given one: it must answer, and keep rollouts
        refuse_unsafe_redis(settings, agent.name, admits=True, must_answer=True)
    return settings, Ports(gateway, flower or free_port(), trainer or free_port())


def _say(line: str, style: str | None = None) -> None:
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) takes no more lines
        console.print(line, style=style, markup=False)


def _complain(line: str) -> None:
    with contextlib.suppress(OSError):
        errors().print(line, style="red", markup=False)


def _print_fleet(fleet: LocalFleet, redis_server: RedisServer | None) -> None:
    table = Table(title="Rollout Fleet is up", show_header=True)
    table.add_column("service")
    table.add_column("where")
    table.add_row("gateway", fleet.gateway_url)
    table.add_row("workers", f"{fleet.workers} processes")
    table.add_row("metrics", f"{fleet.gateway_url}/metrics, workers: {fleet.worker_metrics_urls()}")
    if fleet.flower:
        user, _, password = fleet.flower_auth.partition(":")
        table.add_row("flower", f"{fleet.flower_url}  (user {user}, password {password})")
    if fleet.mock_trainer:
        table.add_row("mock TrainGate", fleet.mock_trainer_url)
    table.add_row("redis", redis_location(fleet.redis_url))
    table.add_row("logs", str(fleet.log_dir))
    console.print(table)
    if fleet.mock_trainer:
        # The key is never printed: the commands name it, for the user to fill in.
        auth = " -H 'Authorization: Bearer <ROLLOUT_FLEET_API_KEY>'" if fleet.api_key() else ""
        path, body, result = fleet.sample_request()
        console.print("Send a rollout:")
        console.print(
            f"  curl -s -X POST {fleet.gateway_url}{path}{auth} "
            f"-H 'Content-Type: application/json' -d '{body}'",
        )
        if path == "/rollout":
            console.print(
                "Its result (with the polling_lease_token from the answer):\n"
                f"  curl -s {result}{auth} -H 'X-Osmosis-Rollout-Lease: <token>'",
            )
        else:
            console.print(f"Its result:\n  curl -s {result}")
    console.print(
        "In another terminal, rollout-fleet status <id>, ls, cancel and export find this fleet."
    )
    if redis_server is not None:  # its own, without a password: the URL is safe to print
        console.print(f"Other tools: export REDIS_URL={redis_server.url}")
    console.print("Press Ctrl-C to stop.")


def _stop_on_signals() -> None:
    """Ctrl-C, SIGTERM (a supervisor's stop) and SIGHUP (a closed terminal) all stop the fleet
    cleanly. Set explicitly: started in the background by a script, a process inherits SIGINT
    ignored (and Python then never raises KeyboardInterrupt); SIGTERM and SIGHUP would kill it
    without stopping its children."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)


def _ignore_signals() -> None:
    """The fleet is stopped or being killed: a further signal must not cut ``up``'s last
    words (the reaper finishes the work as ``up`` exits)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


@dataclass
class _Run:
    """One ``up``'s fleet: started by :meth:`serve`, stopped by :meth:`stop`."""

    options: UpOptions
    settings: FleetSettings
    ports: Ports
    folder: Path
    group: int  # the reaper's process group
    began: float
    redis_server: RedisServer | None = None
    fleet: LocalFleet | None = None

    def progress(self, line: str) -> None:
        _say(f"{line} ({time.monotonic() - self.began:.0f}s)")

    def _start_redis(self) -> str:
        if "redis_url" in self.settings.model_fields_set:
            self.progress(f"Redis ✓ {redis_location(self.settings.redis_dsn)} (REDIS_URL)")
            return self.settings.redis_dsn
        self.redis_server = RedisServer(process_group=self.group, data_dir=self.folder / "redis")
        self.redis_server.start()
        self.progress(f"Redis ✓ {self.redis_server.url}")
        return self.redis_server.url

    def serve(self) -> int:
        """Start the fleet and keep it running until a process of it stops (a signal ends it
        sooner, as ``KeyboardInterrupt``); the exit code ``up`` ends with."""
        try:
            redis_url = self._start_redis()
        except TimeoutError:
            assert self.redis_server is not None
            process = self.redis_server.process
            assert process is not None
            _complain(f"Redis did not start: {process.last_words()} (its log: {process.log_path})")
            return 1
        options = self.options
        self.fleet = LocalFleet(
            agent=options.agent,
            redis_url=redis_url,
            workers=options.workers,
            concurrency=options.concurrency,
            gateway_workers=options.gateway_workers,
            flower=options.flower,
            mock_trainer=options.mock_trainer,
            log_dir=self.folder,
            gateway_port=self.ports.gateway,
            flower_port=self.ports.flower,
            mock_trainer_port=self.ports.mock_trainer,
            process_group=self.group,
        )
        try:
            self.fleet.start(START_TIMEOUT_SECONDS, progress=self.progress)
        except ChildExited as exc:  # its message names its log
            _complain(f"the fleet did not start: {exc}")
            return 1
        except TimeoutError as exc:
            _complain(f"the fleet did not start: {exc} (logs: {self.folder})")
            return 1
        state.announce(
            state.UpFleet(
                os.getpid(),
                self.fleet.redis_url,
                self.settings.key_prefix,
                self.fleet.gateway_url,
                time.time(),
            )
        )
        _print_fleet(self.fleet, self.redis_server)
        return self._supervise(self.fleet)

    def _supervise(self, fleet: LocalFleet) -> int:
        """Restart workers that exit (they recycle themselves); return once another process
        has stopped."""
        while True:
            time.sleep(0.5)
            for name in fleet.restart_dead_workers():
                _say(f"{name} exited; restarted it", style="yellow")
            for process in fleet.processes.values():
                if not process.alive():
                    _complain(f"{process.exit_summary()}; stopping the fleet")
                    return 1

    def stop(self) -> None:
        """Stop the fleet, then its Redis."""
        if self.fleet is not None:
            self.fleet.stop()
        if self.redis_server is not None:
            self.redis_server.stop()


def _run(run: _Run) -> int:
    """Serve, then stop in order; a second signal while stopping leaves the rest to the reaper
    (it kills what is left as ``up`` exits). The exit code: 0 after a signal, 130 after a
    second one, 1 if the fleet failed."""
    try:
        code = run.serve()
    except KeyboardInterrupt:
        _say("stopping... (Ctrl-C again to kill it all at once)")
        code = 0
    try:
        run.stop()
    except KeyboardInterrupt:
        _ignore_signals()
        _say("killing what is left...", style="red")
        return 130
    _ignore_signals()
    return code


def up(options: UpOptions) -> None:
    """``rollout-fleet up`` (see the module); exits with its code."""
    _stop_on_signals()
    began = time.monotonic()
    try:
        settings, ports = _preflight(options)
    except KeyboardInterrupt:
        _say(f"{STOPPED} (nothing was started)")
        raise typer.Exit(0) from None
    pid = os.getpid()
    folder = logdirs.new_run_folder(pid)
    reaper = Reaper.start(state.state_file(pid))
    try:
        _say(f"starting Rollout Fleet; logs: {folder}")
        run = _Run(options, settings, ports, folder, reaper.group, began)
        code = _run(run)
    except KeyboardInterrupt:  # between the preflight and the run: nothing is serving yet
        _ignore_signals()
        code = 0
    finally:
        state.state_file(pid).unlink(missing_ok=True)
        reaper.close()  # after a clean stop there is nothing left for it to kill
    _say(f"{STOPPED} (logs: {folder})")
    raise typer.Exit(code)


__all__ = ["STOPPED", "UpOptions", "up"]
