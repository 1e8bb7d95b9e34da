"""The agent author's command line: ``rollout-sdk`` (also installed as ``osmosis``).

rollout-sdk validate -m server:agent_loop
rollout-sdk test -m server:agent_loop -d rows.jsonl --base-url http://localhost:8000/v1 --model m
rollout-sdk serve -m server:agent_loop --local -p 9000
rollout-sdk mock-trainer --responder calculator -p 9001
rollout-sdk eval run configs/eval/default.toml --name first-try
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

try:
    import typer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise SystemExit("the CLI needs typer: pip install 'rollout-sdk[cli]'") from exc

from rollout_sdk.lazy_group import lazy_group

# Everything else is imported by the command that needs it: `rollout-sdk --help` (and every
# command's start) would otherwise pay for FastAPI, rich, the agent loader and the eval code.
if TYPE_CHECKING:
    from rollout_sdk.core.base import RolloutAgentLoop
    from rollout_sdk.evaluation.config import EvalConfig
    from rollout_sdk.evaluation.run import Executor
    from rollout_sdk.loader import Agent
    from rollout_sdk.localrun.runner import RunOptions

app = typer.Typer(
    name="rollout-sdk",
    help="Validate, serve and test rollout agents.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # click's plain help: quick to start, paragraphs rewrapped whole
)


def _in_process(agent: Agent, config: EvalConfig, options: RunOptions) -> Executor:
    from rollout_sdk.evaluation.local import LocalExecutor

    return LocalExecutor(agent, options, default_in_flight=config.batch_size or 1)


def _eval_app() -> typer.Typer:
    from rollout_sdk.evaluation.command import eval_app

    return eval_app(_in_process, "in this process", "rollout-sdk")


app.add_typer(
    typer.Typer(),
    name="eval",
    help="Evaluate an agent on a dataset (in this process).",
    no_args_is_help=True,
    cls=lazy_group(_eval_app),
)

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

ModuleOption = Annotated[
    str, typer.Option("-m", "--module", help="Agent loop as module.path:attribute")
]
AgentOption = Annotated[
    str,
    typer.Option(
        "-m",
        "--module",
        "--agent",
        help="The agent: module.path:attribute or file.py:attribute, or a v2 entry point "
        "(file.py or module) defining one AgentWorkflow",
    ),
]


def fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(1)


def _check_alias_setting() -> None:
    """A wrong ROLLOUT_SDK_OSMOSIS_ALIAS is its own mistake, not the agent reference's."""
    from rollout_sdk.compat import AliasSettingError, alias_mode

    try:
        alias_mode()
    except AliasSettingError as exc:
        fail(str(exc))


def load_loop_or_exit(reference: str) -> RolloutAgentLoop:
    from rollout_sdk.loader import AgentLoadError, load_agent_loop, split_reference

    _check_alias_setting()
    try:
        if split_reference(reference)[1] is None:
            fail(f"invalid module spec {reference!r}: expected 'module.path:attribute'")
        return load_agent_loop(reference)
    except AgentLoadError as exc:
        fail(str(exc))


def load_agent_or_exit(reference: str) -> Agent:
    """Either generation's agent, or ``Error: ...`` and exit 1."""
    from rollout_sdk.loader import AgentLoadError, load_agent, split_reference

    _check_alias_setting()
    try:
        return load_agent(reference)
    except AgentLoadError as exc:
        if split_reference(reference)[1] is None:
            fail(
                f"invalid module spec {reference!r}: expected 'module.path:attribute' (an "
                f"agent loop) or an entry point defining one AgentWorkflow ({exc})"
            )
        fail(str(exc))


@app.callback()
def _load_env() -> None:
    from dotenv import load_dotenv

    load_dotenv(".env")


@app.command()
def validate(
    module: AgentOption,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Show warnings")] = False,
) -> None:
    """Check an agent.

    A v1 loop's name, tools and run method, or a v2 workflow and grader.
    """
    from rollout_sdk.server.serve import validate_and_report

    if not validate_and_report(load_agent_or_exit(module), verbose=verbose).valid:
        raise typer.Exit(1)


@app.command("test")
def run_rows(
    module: AgentOption,
    dataset: Annotated[Path, typer.Option("-d", "--dataset", help=".jsonl, .parquet or .csv")],
    model: Annotated[str, typer.Option(help="Model name sent to the endpoint")] = "gpt-5-mini",
    base_url: Annotated[
        str, typer.Option(help="OpenAI-compatible endpoint (…/v1)")
    ] = "https://api.openai.com/v1",
    api_key: Annotated[
        str | None, typer.Option(help="Key for the endpoint (default: $API_KEY_ENV's value)")
    ] = None,
    api_key_env: Annotated[
        str, typer.Option(help="Environment variable holding the key (if --api-key is not set)")
    ] = "OPENAI_API_KEY",
    max_turns: Annotated[int, typer.Option(help="v1 request max_turns")] = 10,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature (default: the endpoint's)")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Tokens per completion (default: the endpoint's)")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Rows to run (default: all)")] = None,
    offset: Annotated[int, typer.Option(min=0, help="First row to run")] = 0,
    concurrency: Annotated[
        int, typer.Option("-c", "--concurrency", min=1, help="Rows run at once")
    ] = 1,
    interactive: Annotated[
        bool, typer.Option("-i", "--interactive", help="Step through one LLM call at a time")
    ] = False,
    row: Annotated[
        int | None, typer.Option(help="Row to start at (with -i; default: the first)")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o", "--output", help="Results: .jsonl per row, else a report (default: none)"
        ),
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option("--log", help="Write each rollout's trace to DIR/<id>.jsonl (default: none)"),
    ] = None,
    debug: Annotated[bool, typer.Option(help="Same as --log ./test_debug")] = False,
    quiet: Annotated[
        bool, typer.Option("-q", "--quiet", help="Print only the summary, not each row")
    ] = False,
    pass_threshold: Annotated[
        float, typer.Option(help="A completed row passes when its reward is at least this")
    ] = 1.0,
) -> None:
    """Run an agent on dataset rows, in this process.

    Its LLM calls go to any OpenAI-compatible endpoint (--base-url). A row completed when its
    rollout ended without an error, and passed when its reward also reached --pass-threshold
    (the words of eval run).
    """
    import asyncio

    from rich.console import Console

    from rollout_sdk.localrun.command import TestOptions, load_rows, run_test
    from rollout_sdk.localrun.dataset import DatasetError
    from rollout_sdk.localrun.runner import RunOptions

    if row is not None and not interactive:
        fail("--row needs --interactive")
    agent = load_agent_or_exit(module)
    params = {"temperature": temperature, "max_tokens": max_tokens}
    options = TestOptions(
        dataset=dataset,
        model=model,
        base_url=base_url,
        api_key=api_key or os.environ.get(api_key_env) or None,
        offset=offset,
        limit=limit,
        concurrency=concurrency,
        interactive=interactive,
        row=row,
        output=output,
        quiet=quiet,
        pass_threshold=pass_threshold,
        run=RunOptions(
            max_turns=max_turns,
            completion_params={k: v for k, v in params.items() if v is not None},
            log_dir=Path("test_debug") if debug and log_dir is None else log_dir,
        ),
    )
    try:
        rows = load_rows(agent, options)
    except DatasetError as exc:
        fail(str(exc))
    if not rows:
        fail(f"no rows to run in {dataset} (offset {offset}, limit {limit})")
    console = Console()
    summary = asyncio.run(run_test(agent, rows, options, console))
    console.print(summary.table())
    if summary.stopped_early or summary.failed:
        raise typer.Exit(1)


@app.command()
def serve(
    module: ModuleOption,
    port: Annotated[int, typer.Option("-p", "--port", help="Port to listen on")] = 9000,
    host: Annotated[str, typer.Option("-H", "--host", help="Interface to bind")] = "0.0.0.0",
    no_validate: Annotated[
        bool, typer.Option("--no-validate", help="Serve without validating the agent loop")
    ] = False,
    validate_only: Annotated[
        bool, typer.Option("--validate-only", help="Validate the agent loop, then exit")
    ] = False,
    reload: Annotated[
        bool, typer.Option("--reload", help="Upstream's flag, ignored here (warns)")
    ] = False,
    log_level: Annotated[
        str, typer.Option("--log-level", help=f"One of {', '.join(LOG_LEVELS)}")
    ] = "info",
    skip_register: Annotated[
        bool, typer.Option("--skip-register", help="Upstream's flag (nothing registers here)")
    ] = False,
    local: Annotated[
        bool,
        typer.Option("--local", "--local-debug", help="No server key (no auth), no registration"),
    ] = False,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", help="Key trainers must send (default: one is generated)"),
    ] = None,
    log_dir: Annotated[
        str | None,
        typer.Option(
            "--log", help="Write each rollout's trace under DIR/<start time>/ (default: none)"
        ),
    ] = None,
) -> None:
    """Serve an agent loop in-process (v1 protocol)."""
    import logging

    from rollout_sdk.server.serve import ServeError, serve_agent_loop, validate_and_report
    from rollout_sdk.validator import AgentLoopValidationError

    if log_level not in LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    agent_loop = load_loop_or_exit(module)
    if validate_only:
        if not validate_and_report(agent_loop).valid:
            raise typer.Exit(1)
        return
    logging.basicConfig(level=log_level.upper() if log_level != "trace" else "DEBUG")
    try:
        serve_agent_loop(
            agent_loop,
            host=host,
            port=port,
            validate=not no_validate,
            log_level=log_level,
            reload=reload,
            skip_register=skip_register,
            api_key=api_key,
            local_debug=local,
            debug_dir=log_dir,
        )
    except (ServeError, AgentLoopValidationError) as exc:
        fail(str(exc))


@app.command("mock-trainer")
def mock_trainer(
    port: Annotated[int, typer.Option("-p", "--port", help="Port to listen on")] = 9001,
    host: Annotated[str, typer.Option("-H", "--host", help="Interface to bind")] = "127.0.0.1",
    responder: Annotated[
        str, typer.Option(help="keyword (reference behaviour) or calculator")
    ] = "keyword",
    latency: Annotated[float, typer.Option(help="Seconds added to every chat call")] = 0.0,
    record_calls: Annotated[bool, typer.Option(help="Keep every call for /mock/calls")] = True,
) -> None:
    """Run the mock TrainGate.

    It stands in for a trainer's LLM and callback endpoints.
    """
    import uvicorn

    from rollout_sdk.testing import RESPONDERS, create_mock_trainer_app

    if responder not in RESPONDERS:
        fail(f"--responder must be one of {', '.join(sorted(RESPONDERS))}")
    mock = create_mock_trainer_app(
        responder=RESPONDERS[responder](), latency_s=latency, record_calls=record_calls
    )
    uvicorn.run(mock, host=host, port=port, log_level="warning")


def main() -> None:
    app()


__all__ = ["app", "main"]


if __name__ == "__main__":
    main()
