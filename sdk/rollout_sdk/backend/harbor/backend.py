"""``HarborBackend``: each rollout one Harbor trial in a sandbox of its own (SDK.md §2.8).

The ``harbor`` package does the work: it starts the task's environment, runs the agent in it
(a Harbor agent such as ``oracle`` or ``terminus-2``, given the TrainGate as its model), and
grades with the task's ``tests/test.sh``. This class chooses the task, names and labels the
trial's sandbox for the execution that owns it (``sandbox.py``), limits how many sandboxes
run at once, reuses one image per task (``tasks.py``), removes the sandbox whatever ends the
trial, and turns the trial's result into the rollout's (``results.py``).

The constructor takes upstream's arguments. Those a fleet cannot honour are refused at
construction with what to do instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harbor.models.environment_type import EnvironmentType
from harbor.models.trial.config import AgentConfig as HarborAgentConfig
from harbor.models.trial.config import EnvironmentConfig as HarborEnvironmentConfig
from harbor.models.trial.config import TaskConfig, TrialConfig, VerifierConfig
from harbor.trial.trial import Trial

from rollout_sdk.backend.artifacts import artifacts_dir
from rollout_sdk.backend.base import ExecutionBackend
from rollout_sdk.backend.harbor import environment as confined
from rollout_sdk.backend.harbor import results
from rollout_sdk.backend.harbor.egress import (
    RELAY_SERVICE,
    Egress,
    RefusedRoute,
    Route,
    build_relay,
    checked,
    relay_image,
)
from rollout_sdk.backend.harbor.egress import overlay as egress_overlay
from rollout_sdk.backend.harbor.engine import BuildFailed, DockerEngine, EngineError
from rollout_sdk.backend.harbor.harness import IMPORT_PATH, STAGED, Staging
from rollout_sdk.backend.harbor.in_sandbox import StagedRollout
from rollout_sdk.backend.harbor.policy import Limits, SandboxPolicy, disk_cap_mb
from rollout_sdk.backend.harbor.sandbox import (
    EXECUTION_LABEL,
    SandboxOwner,
    current_owner,
    write_overlay,
)
from rollout_sdk.backend.harbor.tasks import (
    PreparedTasks,
    TaskError,
    TaskMode,
    TaskSources,
    task_folder,
)
from rollout_sdk.backend.harbor.thread import on_harbor_loop
from rollout_sdk.backend.harbor.workflows import PackingError, SandboxWorkflow
from rollout_sdk.backend.sandboxed import SandboxSettings
from rollout_sdk.client.destinations import loopback_host
from rollout_sdk.context import get_rollout_context
from rollout_sdk.types.sample import (
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    RolloutErrorCategory,
    RolloutStatus,
)

logger = logging.getLogger(__name__)

# Harbor's agents that talk to no model: their rollouts carry no trajectory to train on.
SILENT_AGENTS = frozenset({"oracle", "nop"})
DEFAULT_SANDBOX_SLOTS = 8  # upstream's template: TrialQueue(n_concurrent=8)
DEFAULT_LOG_RETENTION_SECONDS = 24 * 3600.0
DISK_CHECK_SECONDS = 3.0  # how often a running trial's disk use is read


class HarborBackendError(ValueError):
    """A HarborBackend option this deployment cannot honour; the message says what instead."""


def _name_of(agent: Any) -> str:
    return agent if isinstance(agent, str) else getattr(agent, "__name__", repr(agent))


def _project_dir(agent: Any) -> Path:
    """The folder holding ``agent``'s ``pyproject.toml`` (upstream's default ``code_dir``),
    else the folder of its module."""
    module = sys.modules.get(getattr(agent, "__module__", ""))
    source = Path(getattr(module, "__file__", "") or ".").resolve()
    for folder in source.parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    return source.parent


def _slots_of(orchestrator: Any) -> int:
    for name in ("n_concurrent", "_n_concurrent", "n_concurrent_trials"):
        value = getattr(orchestrator, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_SANDBOX_SLOTS


def _refuse_what_cannot_apply(
    agent: Any,
    grader: Any,
    bundle: Any,
    patch_dockerfile_with_sdk: bool | None,
    environment_config: HarborEnvironmentConfig | None,
    max_queue_depth: int | None,
) -> None:
    """Upstream's options this fleet cannot honour, each refused with what to do instead."""
    if agent is None:
        raise HarborBackendError(
            "pass agent=: a Harbor agent name such as 'oracle', or an AgentWorkflow"
        )
    native = isinstance(agent, str) and ":" not in agent
    if native and grader is not None:
        raise HarborBackendError(
            f"grader= with the Harbor agent {agent!r}: such a trial is graded by the task's "
            "tests/test.sh; leave grader out (a Grader grades AgentWorkflow agents)"
        )
    if bundle is not None:
        raise HarborBackendError(
            "bundle=: this fleet packs the sandbox itself from code_dir (the project folder "
            "with pyproject.toml); pass code_dir instead of a prebuilt wheel"
        )
    if patch_dockerfile_with_sdk is False and not native:
        raise HarborBackendError(
            "patch_dockerfile_with_sdk=False: a sandbox here cannot install packages when a "
            "trial starts (it reaches only the TrainGate), so the workflow's packages go into "
            "the image; leave the option out"
        )
    kind = environment_config.type if environment_config is not None else None
    if kind not in (None, EnvironmentType.DOCKER):
        raise HarborBackendError(
            f"environment_config.type={kind.value!r}: this fleet runs sandboxes on a Docker "
            "engine (DOCKER_HOST); use EnvironmentType.DOCKER"
        )
    if max_queue_depth is not None and max_queue_depth < 1:
        raise HarborBackendError("max_queue_depth must be 1 or more, or None for unbounded")


class HarborBackend(ExecutionBackend):
    def __init__(
        self,
        *,
        orchestrator: Any = None,
        tasks_dir: Path | str,
        agent: str | type | None = None,
        native_agent_kwargs: dict[str, Any] | None = None,
        task_mode: TaskMode | str = TaskMode.TEMPLATE,
        model_name: str = "openai/osmosis-rollout",
        grader: type | str | None = None,
        workflow_config: Any = None,
        grader_config: Any = None,
        code_dir: Path | str | None = None,
        bundle: Path | str | None = None,
        environment_config: HarborEnvironmentConfig | None = None,
        trials_dir: Path | str | None = None,
        cleanup_successful_trials: bool = True,
        patch_dockerfile_with_sdk: bool | None = None,
        agent_setup_timeout_sec: float | None = None,
        max_queue_depth: int | None = None,
        prewarm: str | bool | None = None,
        verified_tasks: Any = False,
    ) -> None:
        self.tasks_dir = Path(tasks_dir).resolve()
        _refuse_what_cannot_apply(
            agent, grader, bundle, patch_dockerfile_with_sdk, environment_config, max_queue_depth
        )
        try:
            self.task_mode = TaskMode(task_mode)
        except ValueError:
            raise HarborBackendError(
                f"task_mode={task_mode!r} is not a task mode: use 'template' or 'dataset'"
            ) from None
        native = isinstance(agent, str) and ":" not in agent
        self.agent = agent if native else _name_of(agent)
        self.workflow: SandboxWorkflow | None = None
        if not native:
            folder = Path(code_dir) if code_dir else _project_dir(agent)
            try:
                self.workflow = SandboxWorkflow.of(
                    agent, workflow_config, grader, grader_config, folder.resolve()
                )
            except PackingError as exc:
                raise HarborBackendError(str(exc)) from None
        self.native_agent_kwargs = dict(native_agent_kwargs or {})
        self.model_name = model_name
        self.workflow_config = workflow_config
        self.grader_config = grader_config
        self.code_dir = Path(code_dir) if code_dir else None
        self.environment_config = (
            environment_config.model_copy(deep=True)
            if environment_config is not None
            else HarborEnvironmentConfig(type=EnvironmentType.DOCKER)
        )
        self.environment_config.type = EnvironmentType.DOCKER
        self._given_trials_dir = Path(trials_dir) if trials_dir else None
        self.engine = DockerEngine()
        self.settings = SandboxSettings()
        self.build_network = self.settings.build_network
        self.sources = TaskSources()
        self.use_folder(Path(tempfile.gettempdir()) / f"rollout-harbor-{os.getuid()}")
        self.cleanup_successful_trials = cleanup_successful_trials
        self.agent_setup_timeout_sec = agent_setup_timeout_sec
        self.max_queue_depth = max_queue_depth
        self.prewarm_mode = prewarm
        self.sandbox_slots = _slots_of(orchestrator)
        self.log_retention_seconds = DEFAULT_LOG_RETENTION_SECONDS
        self.egress = Egress.TRAINGATE
        self._slots: asyncio.Semaphore | None = None
        self.queued = 0
        self.running = 0
        self._trials: dict[str, asyncio.Task[Any]] = {}
        self._trials_running: set[str] = set()  # trial names whose folders are in use

    @property
    def name(self) -> str:
        return f"harbor:{self.agent}@{self.tasks_dir.name}"

    # --- settings a fleet gives -------------------------------------------------------------

    def configure(self, settings: SandboxSettings) -> None:
        """The worker's settings: sandboxes at once, the network image builds use, where a
        sandbox may connect, the limits every sandbox runs under, which task folders and
        hosts a rollout may name, how long and how much of failed trials' folders are kept,
        and the folder they are kept in."""
        if settings.log_retention_seconds is not None:
            self.log_retention_seconds = settings.log_retention_seconds
        if settings.slots:
            self.sandbox_slots = settings.slots
        self.settings = settings
        self.build_network = settings.build_network
        self.egress = Egress(settings.egress)
        self.sources = TaskSources(
            roots=tuple(Path(root) for root in settings.task_roots),
            git_hosts=frozenset(host.lower() for host in settings.task_hosts),
        )
        self.use_folder(Path(settings.folder) if settings.folder else self._root)

    def use_folder(self, root: Path) -> None:
        """Keep the trials' folders (unless ``trials_dir=`` named one), the prepared task
        copies and the Compose overlays under ``root``. What a trial bind-mounts from there
        the engine finds on its own host at the same path: a worker in a container keeps
        ``root`` at one path in the container and on the engine's host (docs/SANDBOXES.md)."""
        self._root = root
        self.trials_dir = self._given_trials_dir or root / "trials"
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        self.scratch = root / "overlays"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.tasks = PreparedTasks(
            root / "tasks",
            self.engine,
            self.build_network,
            self.settings.build_hosts,
            self.settings.registries,
        )

    async def check_engine(self) -> None:
        """The docker CLI, its compose plugin and the engine answer (else one line)."""
        await self.engine.check_ready()

    # --- ExecutionBackend -------------------------------------------------------------------

    def has_capacity(self) -> bool:
        if self.max_queue_depth is None:
            return True
        return self.queued + self.running < self.max_queue_depth

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "max_queue_depth": self.max_queue_depth,
            "concurrency": {
                "max_concurrent": self.sandbox_slots,
                "queued": self.queued,
                "running": self.running,
            },
            "sandboxes": self.sandbox_figures(),
            # Upstream's sign, read by local evaluations: a sandbox that calls the model cannot
            # reach this host's loopback, so the chat endpoint must listen elsewhere.
            "chat_endpoint": {
                "environment": "docker",
                "requires_public_url": self._talks_to_the_model(),
            },
        }

    def sandbox_figures(self) -> dict[str, int]:
        return {"slots": self.sandbox_slots, "running": self.running, "waiting": self.queued}

    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        cancelled: dict[str, str] = {}
        for rollout_id, task in list(self._trials.items()):
            if all or (ids and rollout_id in ids) or (prefix and rollout_id.startswith(prefix)):
                task.cancel()
                cancelled[rollout_id] = "cancelled"
        return cancelled

    async def prune_trials(self) -> int:
        """Remove the folders of trials that ended longer ago than the retention (failed
        trials' logs; successful ones go at once), then the oldest while they take more than
        the cap (``ROLLOUT_FLEET_SANDBOX_TRIALS_MB``); how many."""
        return await asyncio.to_thread(
            _prune,
            self.trials_dir,
            self.log_retention_seconds,
            self.settings.trials_mb * 2**20,
            set(self._trials_running),
        )

    async def prewarm(self, tasks: Any = None) -> None:
        """Build the images of the configured tasks before rollouts arrive."""
        folders: list[Path] = []
        if self.task_mode is TaskMode.TEMPLATE:
            folders.append(self.tasks_dir)
        else:
            folders.extend(
                p for p in sorted(self.tasks_dir.iterdir()) if (p / "task.toml").is_file()
            )
        for folder in folders:
            await self.tasks.prepare(folder, self.workflow)

    def prewarm_lifespan(self, tasks: Any = None) -> Any:
        """An ASGI lifespan that prewarms before serving (upstream's name)."""
        from contextlib import asynccontextmanager

        backend = self

        @asynccontextmanager
        async def lifespan(app: Any) -> Any:
            if backend.prewarm_mode not in (False, "off"):
                await backend.prewarm(tasks)
            yield

        return lifespan

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        ctx = get_rollout_context()
        owner = current_owner.get() or SandboxOwner(
            fleet="local",
            record=request.id,
            rollout=request.id,
            execution=f"{os.getpid()}:{uuid.uuid4().hex[:12]}",
        )
        try:
            folder = task_folder(self.tasks_dir, self.task_mode, request.metadata, self.sources)
            if isinstance(folder, str):
                folder = await self._fetch(folder, request.metadata or {})
            prepared = await self.tasks.prepare(folder, self.workflow)
            if self.workflow is None and self.task_mode is TaskMode.TEMPLATE:
                prepared = await self.tasks.instructed(
                    prepared, self.trials_dir / owner.trial_name, request.prompt
                )
        except (TaskError, PackingError, OSError) as exc:
            return _failed(str(exc), RolloutErrorCategory.VALIDATION_ERROR)
        except BuildFailed as exc:
            return _failed(
                f"the task's image did not build: {exc.step}", RolloutErrorCategory.VALIDATION_ERROR
            )
        except EngineError as exc:
            return _failed(
                f"the sandbox image is not ready: {exc}", RolloutErrorCategory.INTERNAL_ERROR
            )
        if self._slots is None:  # made on first use: configure() may change the limit
            self._slots = asyncio.Semaphore(self.sandbox_slots)
        current = asyncio.current_task()
        if current is not None:
            self._trials[request.id] = current
        self.queued += 1
        try:
            try:
                await self._slots.acquire()
            finally:
                self.queued -= 1
            try:
                self.running += 1
                return await self._trial(request, prepared, owner, ctx)
            finally:
                self.running -= 1
                self._slots.release()
        finally:
            self._trials.pop(request.id, None)

    async def _fetch(self, reference: str, metadata: dict[str, Any]) -> Path:
        """A task from a git checkout, its host allowed by the operator (``task_folder``)
        and its address checked as every address the fleet connects to."""
        from harbor.models.task.id import GitTaskId
        from harbor.tasks.client import TaskClient

        url = str(metadata["git_url"])
        if ".." in Path(reference).parts or Path(reference).is_absolute():
            raise TaskError(
                f"metadata['harbor_task']={reference!r} must be a path inside the checkout"
            )
        parts = urlsplit(url)
        try:
            await checked(Route(parts.hostname or "", parts.port or 443, "", url))
        except RefusedRoute as exc:
            raise TaskError(f"metadata['git_url']: {exc}") from None
        task_id = GitTaskId(
            git_url=url, git_commit_id=metadata.get("git_commit_id"), path=Path(reference)
        )
        batch = await TaskClient().download_tasks([task_id])
        return Path(batch.paths[0])

    def _agent_config(self, request: ExecutionRequest, ctx: Any) -> HarborAgentConfig:
        metadata = request.metadata or {}
        if self.workflow is not None:
            config = HarborAgentConfig(import_path=IMPORT_PATH)
        elif self.agent in SILENT_AGENTS:
            config = HarborAgentConfig(name=self.agent, kwargs=dict(self.native_agent_kwargs))
        else:
            url = (ctx.chat_completions_url if ctx else "") or ""
            if not url:
                raise TaskError(f"agent {self.agent!r} needs the rollout's chat endpoint")
            base_url = url.removesuffix("/chat/completions")
            config = HarborAgentConfig(
                name=self.agent,
                model_name=str(metadata.get("harbor_model") or self.model_name),
                base_url=base_url,
                kwargs={"api_base": base_url, **self.native_agent_kwargs},
                env={"OPENAI_API_KEY": (ctx.api_key if ctx else None) or "unused"},
            )
        if request.agent_timeout_sec is not None:
            config.override_timeout_sec = request.agent_timeout_sec
        if self.agent_setup_timeout_sec is not None:
            config.override_setup_timeout_sec = self.agent_setup_timeout_sec
        return config

    def _staging(self, request: ExecutionRequest, ctx: Any) -> Staging:
        """The rollout as the sandbox's runner takes it (the key apart)."""
        assert self.workflow is not None
        url = (ctx.chat_completions_url if ctx else "") or ""
        if not url:
            raise TaskError("the rollout has no chat_completions_url for its workflow to call")
        staged = StagedRollout(
            request=request.model_dump(mode="json"),
            chat_completions_url=url,
            workflow=self.workflow.workflow,
            workflow_config=self.workflow.workflow_config,
            grader=self.workflow.grader,
            grader_config=self.workflow.grader_config,
        )
        return Staging(staged, ctx.api_key if ctx else None, request.agent_timeout_sec)

    def _talks_to_the_model(self) -> bool:
        """Whether the agent calls the TrainGate from inside the sandbox."""
        return self.workflow is not None or self.agent not in SILENT_AGENTS

    async def _egress(self, ctx: Any, owner: SandboxOwner) -> tuple[dict[str, Any], Route | None]:
        """The overlay part that closes the sandbox's network, and the TrainGate route."""
        if self.egress is Egress.OPEN:
            return {}, None
        url = (ctx.chat_completions_url if ctx else "") or ""
        route = await checked(Route.to(url)) if url and self._talks_to_the_model() else None
        image = await build_relay(self.engine) if route is not None else None
        return egress_overlay(owner.labels(), route, image), route

    async def _trial(
        self, request: ExecutionRequest, task: Path, owner: SandboxOwner, ctx: Any
    ) -> ExecutionOutcome:
        try:
            plan = await self._plan(request, task, owner, ctx)
        except _Refused as cannot:
            return _failed(cannot.message, cannot.category)
        trial_dir = self.trials_dir / owner.trial_name
        succeeded = False
        refused: list[str] = []
        self._trials_running.add(owner.trial_name)
        try:
            result = await self._run_watched(plan.config, owner, plan.limits, refused)
            if refused:
                return _failed(
                    f"the sandbox was refused: {refused[0]}", RolloutErrorCategory.VALIDATION_ERROR
                )
            done = await asyncio.to_thread(
                results.outcome,
                result,
                trial_dir,
                graded=not plan.config.verifier.disable,
                workflow=self.workflow is not None,
                silent=self.workflow is None and self.agent in SILENT_AGENTS,
            )
            succeeded = done.result.status is RolloutStatus.SUCCESS
            await _keep_artifacts(trial_dir, request.id)
            return done
        finally:
            STAGED.pop(owner.trial_name, None)
            await _settle(self.engine.remove_trial(owner.trial_name))
            plan.overlay.unlink(missing_ok=True)
            self._trials_running.discard(owner.trial_name)
            if succeeded and self.cleanup_successful_trials:
                await asyncio.to_thread(shutil.rmtree, trial_dir, True)
            else:
                logger.warning("rollout %s: its trial's logs are kept in %s", request.id, trial_dir)

    async def _plan(
        self, request: ExecutionRequest, task: Path, owner: SandboxOwner, ctx: Any
    ) -> _Plan:
        """The trial's configuration: its egress, its policy and its agent; or
        :class:`_Refused` with why the rollout cannot run."""
        url = (ctx.chat_completions_url if ctx else "") or ""
        try:
            if self._talks_to_the_model() and url:
                _reachable(url)
            extra, route = await self._egress(ctx, owner)
        except (TaskError, RefusedRoute) as exc:
            raise _Refused(str(exc)) from None
        except EngineError as exc:
            message = f"the sandbox's egress relay is not ready: {exc}"
            raise _Refused(message, RolloutErrorCategory.INTERNAL_ERROR) from None
        if route is not None and ctx is not None:
            ctx = _Endpoint(route.url, ctx.api_key)
        limits = await asyncio.to_thread(self._limits, task)
        policy = SandboxPolicy(
            limits=limits,
            labels=owner.labels(),
            mount_roots=(str(task),),
            open_networks=frozenset({"egress"}) if route is not None else frozenset(),
            relay=RELAY_SERVICE if route is not None else None,
            closed=self.egress is Egress.TRAINGATE,
            build_network=self.build_network,
            allowed=self.settings.allowed_keys,
            relay_image=relay_image(),
            registries=self.settings.registries,
        )
        environment = self.environment_config.model_copy(deep=True)
        environment.import_path = confined.IMPORT_PATH
        environment.kwargs = {**environment.kwargs, **confined.policy_kwargs(policy)}
        verifier = VerifierConfig(disable=not request.grade or not (task / "tests").is_dir())
        if request.grader_timeout_sec is not None:
            verifier.override_timeout_sec = request.grader_timeout_sec
        try:
            agent = self._agent_config(request, ctx)
            if self.workflow is not None:
                STAGED[owner.trial_name] = self._staging(request, ctx)
        except TaskError as exc:
            raise _Refused(str(exc)) from None
        overlay = write_overlay(owner, self.scratch, extra)
        environment.extra_docker_compose = [*environment.extra_docker_compose, overlay]
        environment.delete = True
        config = TrialConfig(
            task=TaskConfig(path=task),
            trial_name=owner.trial_name,
            trials_dir=self.trials_dir,
            agent=agent,
            environment=environment,
            verifier=verifier,
        )
        return _Plan(config, limits, overlay)

    def _limits(self, task: Path) -> Limits:
        """The operator's limits, lowered by the task's own ``storage_mb``."""
        settings = self.settings
        storage = _task_storage_mb(task)
        return Limits(
            memory_mb=settings.memory_mb,
            pids=settings.pids,
            cpus=settings.cpus,
            disk_mb=disk_cap_mb(settings.disk_mb, storage),
            output_mb=settings.output_mb,
        )

    async def _run_watched(
        self, config: TrialConfig, owner: SandboxOwner, limits: Limits, refused: list[str]
    ) -> Any:
        """The trial on Harbor's own loop, its containers' disk watched: past the cap the
        trial is stopped and the reason noted in ``refused``."""

        async def run() -> Any:
            confined.refusals.set(refused)
            trial = await Trial.create(config)
            return await trial.run()

        trial = asyncio.ensure_future(on_harbor_loop(run()))
        cap = limits.disk_mb * 2**20
        label = f"{EXECUTION_LABEL}={owner.execution}"
        try:
            while not trial.done():
                await asyncio.wait({trial}, timeout=DISK_CHECK_SECONDS)
                if trial.done():
                    break
                try:
                    written = await self.engine.disk_written(label)
                except EngineError:
                    continue
                if written > cap:
                    refused.append(
                        f"its containers wrote {written // 2**20} MB to their disk, over the "
                        f"{limits.disk_mb} MB cap (ROLLOUT_FLEET_SANDBOX_DISK_MB, or the "
                        "task's storage_mb if lower)"
                    )
                    return None
            return trial.result()
        finally:
            # Past the cap, or this rollout cancelled (a cancel, a lost lease): the trial on
            # Harbor's loop is cancelled too, and its own clean-up awaited, before the
            # sandbox is removed; else Harbor could go on creating what was just removed.
            if not trial.done():
                trial.cancel()
                await asyncio.wait({trial})


def _task_storage_mb(task: Path) -> Any:
    try:
        config = tomllib.loads((task / "task.toml").read_text())
    except (OSError, ValueError):
        return None
    return (config.get("environment") or {}).get("storage_mb")


async def _keep_artifacts(trial_dir: Path, rollout_id: str) -> None:
    """The trial's ``artifacts/`` (what the task collects from the sandbox) into the
    rollout's artifacts directory, as upstream relocates them; links are not followed: the
    sandbox made them."""
    source = trial_dir / "artifacts"
    if not source.is_dir() or not any(source.iterdir()):
        return
    target = await artifacts_dir(rollout_id)
    if target is None:
        return

    def copy() -> None:
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source)
            if path.is_symlink():
                continue
            if path.is_dir():
                (target / relative).mkdir(parents=True, exist_ok=True)
            elif path.is_file():
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target / relative)

    try:
        await asyncio.to_thread(copy)
    except OSError as exc:
        logger.warning("rollout %s: its trial's artifacts were not kept: %s", rollout_id, exc)


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def _prune(folder: Path, older_than: float, cap: int, running: set[str]) -> int:
    """Remove trial folders older than ``older_than`` seconds, then the oldest ended ones
    while all of them take more than ``cap`` bytes; how many (runs in a worker thread)."""
    cutoff = time.time() - older_than
    removed = 0
    ended: list[tuple[float, int, Path]] = []
    for trial in folder.iterdir() if folder.is_dir() else ():
        try:
            if not trial.is_dir() or trial.name in running:
                continue
            modified = trial.stat().st_mtime
        except OSError:
            continue
        if modified < cutoff:
            shutil.rmtree(trial, ignore_errors=True)
            removed += 1
        else:
            ended.append((modified, _size(trial), trial))
    total = sum(size for _, size, _ in ended)
    for _, size, trial in sorted(ended, key=lambda entry: entry[0]):
        if total <= cap:
            break
        shutil.rmtree(trial, ignore_errors=True)
        total -= size
        removed += 1
    return removed


@dataclass(frozen=True)
class _Plan:
    """A trial ready to run: Harbor's configuration, its limits and the overlay file."""

    config: TrialConfig
    limits: Limits
    overlay: Path


class _Refused(Exception):
    """The rollout cannot run its trial; the message says why."""

    def __init__(
        self, message: str, category: RolloutErrorCategory = RolloutErrorCategory.VALIDATION_ERROR
    ) -> None:
        super().__init__(message)
        self.message = message
        self.category = category


@dataclass(frozen=True)
class _Endpoint:
    """The rollout's TrainGate as the sandbox reaches it (through the egress relay)."""

    chat_completions_url: str
    api_key: str | None


def _reachable(url: str) -> None:
    """Refuse a TrainGate on this host's loopback: no sandbox can reach it."""
    if loopback_host(urlsplit(url).hostname or ""):
        raise TaskError(
            f"chat_completions_url {url} is on this host's loopback, which a sandbox cannot "
            "reach: give the trainer an address the sandbox engine's containers reach"
        )


async def _settle(work: Any) -> None:
    """Finish ``work`` even while the caller is being cancelled (the sandbox must go)."""
    job = asyncio.ensure_future(work)
    while not job.done():
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            continue
        except Exception:
            logger.warning("could not remove a sandbox; the fleet's sweep will", exc_info=True)
            return
    if not job.cancelled() and job.exception() is not None:
        logger.warning("could not remove a sandbox: %s", job.exception())


def _failed(message: str, category: RolloutErrorCategory) -> ExecutionOutcome:
    return ExecutionOutcome(
        workflow=ExecutionResult(
            status=RolloutStatus.FAILURE, err_message=message, err_category=category
        )
    )


__all__ = ["HarborBackend", "HarborBackendError", "TaskMode"]
