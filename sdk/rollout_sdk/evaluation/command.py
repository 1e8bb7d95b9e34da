"""The ``eval run`` command, written once for both CLIs: ``rollout-sdk eval run`` runs the
work items in this process, ``rollout-fleet eval run`` on a fleet. They differ only in the
executor they make.

``eval run CONFIG.toml`` reads upstream's eval TOML; the v1-era flags work with it or
without it (``-m MODULE -d DATASET --eval-fn module:fn --n 4 ...``). A flag given wins over
the file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from rollout_sdk.evaluation.config import (
    EvalConfig,
    EvalConfigError,
    ModelEndpoint,
    load_eval_config,
    require_secrets,
    resolve_dataset,
)

if TYPE_CHECKING:  # the run itself needs rollout-sdk[server]: imported when a run starts
    from rollout_sdk.evaluation.run import Executor
    from rollout_sdk.loader import Agent
    from rollout_sdk.localrun.runner import RunOptions

ExecutorFactory = Callable[["Agent", EvalConfig, "RunOptions"], "Executor"]
console = Console()
DEFAULT_OUTPUT = Path(".rollout-fleet") / "evals"


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]Error:[/red] {message}", soft_wrap=True, markup=True, highlight=False)
    return typer.Exit(1)


def _endpoint(model: str | None, base_url: str | None, key_env: str | None) -> ModelEndpoint:
    if model is None:
        raise EvalConfigError("--model is required without a config file")
    return ModelEndpoint(
        model=model,
        base_url=base_url or ModelEndpoint.base_url,
        api_key_env=key_env or (None if base_url else "OPENAI_API_KEY"),
    )


def _overridden(
    endpoint: ModelEndpoint, model: str | None, base_url: str | None, key_env: str | None
) -> ModelEndpoint:
    changes = {"model": model, "base_url": base_url, "api_key_env": key_env}
    return dataclasses.replace(endpoint, **{k: v for k, v in changes.items() if v is not None})


def build_config(config_file: Path | None, flags: dict[str, Any]) -> EvalConfig:
    """The run's config: the file's, with every flag given put over it."""
    dataset = flags["dataset_file"] or flags["dataset"]
    if config_file is not None:
        config = load_eval_config(config_file)
        model = _overridden(config.model, flags["model"], flags["base_url"], flags["api_key_env"])
        config = dataclasses.replace(config, model=model)
    elif flags["module"] is None or dataset is None:
        raise EvalConfigError("give a config file, or both -m/--module and -d/--dataset")
    else:
        model = _endpoint(flags["model"], flags["base_url"], flags["api_key_env"])
        config = EvalConfig(agent=flags["module"], dataset=Path(dataset), model=model)
    if flags["baseline_model"] is not None:
        baseline = _endpoint(
            flags["baseline_model"], flags["baseline_base_url"], flags["baseline_api_key_env"]
        )
        config = dataclasses.replace(config, baseline=baseline)
    changes: dict[str, Any] = {
        "agent": flags["module"],
        "dataset": resolve_dataset(str(dataset), Path.cwd()) if dataset else None,
        "n": flags["n"],
        "pass_threshold": flags["pass_threshold"],
        "batch_size": flags["batch_size"],
        "limit": flags["limit"],
    }
    return dataclasses.replace(config, **{k: v for k, v in changes.items() if v is not None})


def again(program: str, argv: Sequence[str], name: str) -> str:
    """The command line that runs the same run again: ``argv``'s arguments after ``eval run``,
    without ``--fresh`` (it would start over) and with the run's ``--name``."""
    rest = list(argv)
    for index in range(len(rest) - 1):
        if rest[index : index + 2] == ["eval", "run"]:
            rest = rest[index + 2 :]
            break
    rest = [arg for arg in rest if arg != "--fresh"]
    if not any(arg == "--name" or arg.startswith("--name=") for arg in rest):
        rest += ["--name", name]
    return shlex.join([program, "eval", "run", *rest])


def eval_app(
    make_executor: ExecutorFactory, where: str, program: str, *, on_fleet: bool = False
) -> typer.Typer:
    """The ``eval`` command group of ``program``, running work items ``where`` says;
    ``on_fleet``: it takes ``--fleet`` (a running fleet to use)."""
    app = typer.Typer(help=f"Evaluate an agent on a dataset ({where}).", no_args_is_help=True)

    @app.command("run")
    def run(
        config_file: Annotated[
            Path | None, typer.Argument(metavar="CONFIG.toml", help="Eval TOML (upstream's)")
        ] = None,
        module: Annotated[
            str | None,
            typer.Option("-m", "--module", "--agent", help="Agent (default: the TOML's)"),
        ] = None,
        dataset: Annotated[
            Path | None,
            typer.Option(
                "-d",
                "--dataset",
                help="Dataset file (default: the TOML's)",
            ),
        ] = None,
        dataset_file: Annotated[
            Path | None,
            typer.Option(
                "--dataset-file",
                help="Upstream's name for --dataset, wins over it (default: --dataset)",
            ),
        ] = None,
        eval_fn: Annotated[
            list[str] | None,
            typer.Option(
                "--eval-fn",
                help="module:function scoring each item, repeatable; the first gives the reward "
                "(default: the agent's own reward)",
            ),
        ] = None,
        n: Annotated[
            int | None,
            typer.Option("--n", min=1, help="Samples per row (default: the TOML's, else 1)"),
        ] = None,
        pass_threshold: Annotated[
            float | None,
            typer.Option(
                "--pass-threshold",
                help="A completed item passes when its reward is at least this "
                "(default: the TOML's, else 1.0)",
            ),
        ] = None,
        batch_size: Annotated[
            int | None,
            typer.Option(
                "--batch-size",
                min=1,
                help="Items at once (default: the TOML's, else what the executor runs at once)",
            ),
        ] = None,
        limit: Annotated[
            int | None, typer.Option("--limit", min=1, help="Rows to run (default: all)")
        ] = None,
        rows: Annotated[
            str | None, typer.Option("--rows", help="Rows, like 0-9,15 (default: all)")
        ] = None,
        model: Annotated[
            str | None,
            typer.Option(
                "--model",
                help="Policy model name sent to the endpoint (default: the TOML's [model])",
            ),
        ] = None,
        base_url: Annotated[
            str | None,
            typer.Option(
                "--base-url",
                help="Policy endpoint, OpenAI-compatible, e.g. http://host:8000/v1 "
                "(default: the TOML's, else OpenAI)",
            ),
        ] = None,
        api_key_env: Annotated[
            str | None,
            typer.Option(
                "--api-key-env",
                help="Environment variable holding the policy endpoint's key (default: none)",
            ),
        ] = None,
        baseline_model: Annotated[
            str | None,
            typer.Option(
                "--baseline-model",
                help="A second model run on the same items, for comparison (default: none)",
            ),
        ] = None,
        baseline_base_url: Annotated[
            str | None,
            typer.Option(
                "--baseline-base-url", help="The baseline model's endpoint (default: the policy's)"
            ),
        ] = None,
        baseline_api_key_env: Annotated[
            str | None,
            typer.Option(
                "--baseline-api-key-env",
                help="Environment variable holding the baseline endpoint's key (default: none)",
            ),
        ] = None,
        name: Annotated[
            str | None, typer.Option("--name", help="Run name, resumes it (default: a new name)")
        ] = None,
        output: Annotated[
            Path, typer.Option("-o", "--output", "--output-path", help="Runs directory")
        ] = DEFAULT_OUTPUT,
        max_in_flight: Annotated[
            int | None,
            typer.Option(
                "--max-in-flight",
                min=1,
                help="Rollouts at once (default: --batch-size, else the fleet's slots, "
                "or 1 in this process)",
            ),
        ] = None,
        fresh: Annotated[bool, typer.Option("--fresh", help="Start the named run over")] = False,
        retry_failed: Annotated[
            bool,
            typer.Option(
                "--retry-failed", help="Resume the named run, running its failed items again"
            ),
        ] = False,
        max_turns: Annotated[int, typer.Option(help="v1 request max_turns")] = 10,
        temperature: Annotated[
            float | None,
            typer.Option(
                help="Sampling temperature sent with each LLM call (default: the endpoint's)"
            ),
        ] = None,
        max_tokens: Annotated[
            int | None, typer.Option(help="Token limit of each LLM call (default: the endpoint's)")
        ] = None,
        quiet: Annotated[
            bool, typer.Option("-q", "--quiet", help="Print only the summary, not each item")
        ] = False,
        bridge_host: Annotated[
            str | None,
            typer.Option(
                "--bridge-host",
                metavar="ADDRESS",
                help="The address the local model bridge listens on, where the rollouts reach "
                "it (default: the TOML's [fleet] bridge_host, else loopback, or this host's "
                "address on its default route for an agent whose sandboxes call the model)",
            ),
        ] = None,
        fleet: Annotated[
            str | None,
            typer.Option(
                "--fleet",
                metavar="URL|new",
                help="rollout-fleet only: a running fleet's gateway URL (default: the "
                "rollout-fleet up running here for this agent, else one started for the run); "
                "'new': start one for the run",
            ),
        ] = None,
    ) -> None:
        """Run every selected row n times, score, and write results, metrics.json and
        report.html under the run's directory."""
        from rollout_sdk.evaluation.results import RunMismatch
        from rollout_sdk.evaluation.run import EvalError, EvalOptions, default_name, run_eval
        from rollout_sdk.evaluation.scoring import EvalFnError, load_eval_fns
        from rollout_sdk.loader import AgentLoadError, load_agent
        from rollout_sdk.localrun.dataset import DatasetError
        from rollout_sdk.localrun.runner import RunOptions

        flags = {
            "module": module,
            "dataset": dataset,
            "dataset_file": dataset_file,
            "n": n,
            "pass_threshold": pass_threshold,
            "batch_size": batch_size,
            "limit": limit,
            "model": model,
            "base_url": base_url,
            "api_key_env": api_key_env,
            "baseline_model": baseline_model,
            "baseline_base_url": baseline_base_url,
            "baseline_api_key_env": baseline_api_key_env,
        }
        if fleet is not None and not on_fleet:
            raise _fail(f"--fleet is rollout-fleet eval run's: {program} runs items in itself")
        try:
            config = build_config(config_file, flags)
            target = dataclasses.replace(
                config.fleet,
                gateway_url=config.fleet.gateway_url if fleet is None else fleet,
                bridge_host=bridge_host or config.fleet.bridge_host,
            )
            config = dataclasses.replace(config, fleet=target)
            require_secrets(config)  # before the agent: it may need them to import
            os.environ.update(config.env)  # the agent's: in this process and a fleet it starts
            fns = load_eval_fns(eval_fn or [])
            agent = load_agent(config.agent)
        except (EvalConfigError, EvalFnError, AgentLoadError, DatasetError) as exc:
            raise _fail(str(exc)) from None
        if config.advanced:
            unused = ", ".join(sorted(config.advanced))
            console.print(f"[advanced] keys are recorded, not used: {unused}", markup=False)
        params = {"temperature": temperature, "max_tokens": max_tokens}
        agent_options = RunOptions(
            max_turns=max_turns,
            completion_params={k: v for k, v in params.items() if v is not None},
            agent_timeout_s=config.agent_timeout_s,
            grader_timeout_s=config.grader_timeout_s,
        )
        run_name = name or default_name(config)
        options = EvalOptions(
            name=run_name,
            output=output,
            rows=rows,
            max_in_flight=max_in_flight or config.batch_size,
            fresh=fresh,
            retry_failed=retry_failed,
            quiet=quiet,
            eval_fns=fns,
            again=again(program, sys.argv[1:], run_name),
        )
        executor = make_executor(agent, config, agent_options)
        try:
            outcome = asyncio.run(run_eval(agent, config, options, executor, console))
        except (EvalError, RunMismatch) as exc:
            raise _fail(str(exc)) from None
        if outcome.interrupted:
            raise typer.Exit(130)
        if outcome.stopped_early is not None:
            raise _fail(f"stopped early: {outcome.stopped_early}")
        if outcome.every_item_failed:
            raise _fail("every work item failed (the failures are listed above)")

    return app


__all__ = ["ExecutorFactory", "again", "build_config", "eval_app"]
