"""The eval TOML: upstream's file, read unchanged, plus our two sections.

Upstream's sections (``osmosis eval run``): ``[experiment]`` (``rollout``, ``entrypoint``,
``model_path``, ``dataset``; ``commit_sha`` and ``completion_webhook`` are the platform's and
only recorded), ``[evaluation]`` (``limit``, ``n``, ``batch_size``, ``pass_threshold``,
``agent_workflow_timeout_s``, ``grader_timeout_s``), ``[env]``, ``[secrets]`` (``required``:
names that must be set in the environment) and ``[advanced]`` (recorded, not used). A section
or key it does not know is refused the way upstream refuses it: one ``Invalid eval config``
error listing every issue.

Ours: ``[model]`` — the OpenAI-compatible endpoint the policy is served from (``base_url``,
``model``, ``api_key_env``) — and ``[fleet]`` — an existing gateway (``gateway_url``,
``api_key_env``) or a fleet started for the run (``workers``, ``concurrency``), and the address
this machine's model bridge listens on, where the workers and the agent's sandboxes reach it
(``bridge_host``; by default loopback, or this host's address on its default route for an
agent whose sandboxes call the model: :mod:`.listen`).

The agent is ``rollouts/<rollout>/<entrypoint>`` of the workspace: the nearest directory, from
the config file's upwards, that has a ``rollouts`` folder.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_ENTRYPOINT = "main.py"
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
SECRET_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
RESERVED_ENV_PREFIX = "_OSMOSIS_"
DATASET_SUFFIXES = (".jsonl", ".parquet", ".csv")
DATASET_FOLDERS = ("datasets", "data")
# What a pydantic error type means in a config issue line ("must be an integer, got 'x'").
EXPECTED = {
    "bool_parsing": "a boolean",
    "bool_type": "a boolean",
    "dict_type": "a table",
    "float_parsing": "a number",
    "float_type": "a number",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "string_type": "a string",
}


class EvalConfigError(Exception):
    """The eval config cannot be used; the message says why (upstream's wording)."""


class _Section(BaseModel):
    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid", strict=True)


class _Webhook(_Section):
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    query_params: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float | None = None
    retries: int | None = None


class _Experiment(_Section):
    rollout: str
    entrypoint: str = DEFAULT_ENTRYPOINT
    model_path: str
    dataset: str
    commit_sha: str | None = None
    completion_webhook: _Webhook | None = None

    @field_validator("commit_sha")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{7,40}", value):
            raise ValueError(
                f"must be a hexadecimal Git commit SHA (7-40 hex characters), got {value!r}"
            )
        return value


class _Evaluation(_Section):
    limit: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    pass_threshold: float | None = None
    agent_workflow_timeout_s: float | None = Field(None, gt=0)
    grader_timeout_s: float | None = Field(None, gt=0)

    @field_validator(
        "pass_threshold", "agent_workflow_timeout_s", "grader_timeout_s", mode="before"
    )
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # TOML's 1 is as good as 1.0
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be finite, got {value!r}")
        return value


class _Model(_Section):
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None


class _Fleet(_Section):
    gateway_url: str | None = None
    api_key_env: str | None = None
    workers: int = Field(2, ge=1)
    concurrency: int | None = Field(None, ge=1)
    bridge_host: str | None = None


class _Advanced(BaseModel):
    model_config: ClassVar[ConfigDict] = ConfigDict(extra="allow")


SECTIONS: dict[str, type[BaseModel]] = {
    "experiment": _Experiment,
    "evaluation": _Evaluation,
    "advanced": _Advanced,
    "model": _Model,
    "fleet": _Fleet,
}
KNOWN_SECTIONS = frozenset({*SECTIONS, "env", "secrets"})


@dataclass(frozen=True)
class ModelEndpoint:
    """Where the policy answers: an OpenAI-compatible endpoint, a model name and its key."""

    model: str
    base_url: str = OPENAI_BASE_URL
    api_key_env: str | None = None

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


@dataclass(frozen=True)
class FleetTarget:
    """Where the rollouts run, for ``rollout-fleet eval run``."""

    gateway_url: str | None = None  # None: start a fleet for the run
    api_key_env: str | None = None
    workers: int = 2
    concurrency: int | None = None
    bridge_host: str | None = None  # None: loopback, or where the agent's sandboxes reach it


@dataclass(frozen=True)
class EvalConfig:
    """Everything a run needs, however it was given (TOML, flags or both)."""

    agent: str  # a loader reference: path/to/main.py, or module:attribute
    dataset: Path
    model: ModelEndpoint
    baseline: ModelEndpoint | None = None
    limit: int | None = None
    n: int = 1
    batch_size: int | None = None
    pass_threshold: float = 1.0
    agent_timeout_s: float | None = None
    grader_timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    advanced: dict[str, Any] = field(default_factory=dict)
    fleet: FleetTarget = field(default_factory=FleetTarget)
    source: Path | None = None  # the TOML file, if any


# --- reading the file -------------------------------------------------------------------------


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise EvalConfigError(f"Config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise EvalConfigError(f"Invalid TOML in {path}: {exc}") from exc
    except OSError as exc:
        raise EvalConfigError(f"Cannot read config file {path}: {exc}") from exc


def _table(raw: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    section = raw.get(name, {})
    if not isinstance(section, dict):
        raise EvalConfigError(f"[{name}] must be a table in {path}")
    return section


def _issue(section: str, error: ErrorDetails) -> str:
    where = ".".join([section, *map(str, error.get("loc") or ())])
    kind = str(error.get("type"))
    if kind == "extra_forbidden":
        return f"{where}: Unrecognized key"
    if kind in EXPECTED:
        return f"{where}: must be {EXPECTED[kind]}, got {error.get('input')!r}"
    return f"{where}: is invalid: {error.get('msg', 'invalid value')}"


def _parse_sections(raw: dict[str, Any], path: Path) -> dict[str, BaseModel]:
    """Every section parsed, or one error listing every issue (upstream's format)."""
    issues = [f"{name}: Unrecognized section" for name in raw if name not in KNOWN_SECTIONS]
    issues += [
        f"env.{key}: must be a string, got {value!r}"
        for key, value in _table(raw, "env", path).items()
        if not isinstance(value, str)
    ]
    parsed: dict[str, BaseModel] = {}
    for name, model in SECTIONS.items():
        try:
            parsed[name] = model.model_validate(_table(raw, name, path))
        except ValidationError as exc:
            issues += [_issue(name, error) for error in exc.errors()]
    if issues:
        raise EvalConfigError("Invalid eval config:\n" + "\n".join(f"  - {i}" for i in issues))
    return parsed


def _secrets(raw: dict[str, Any], path: Path) -> list[str]:
    if "secrets" not in raw:
        return []
    section = _table(raw, "secrets", path)
    unknown = sorted(set(section) - {"required"})
    if unknown:
        raise EvalConfigError(
            f"[secrets] in {path} only supports the 'required' field; "
            f"unknown key(s): {', '.join(unknown)}."
        )
    if "required" not in section:
        raise EvalConfigError(f"Missing 'required' in [secrets] section of {path}")
    names = section["required"]
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise EvalConfigError(
            f"'required' in [secrets] of {path} must be a list of strings, "
            'e.g. required = ["OPENAI_API_KEY"].'
        )
    return names


def _check_names(env: dict[str, str], secrets: list[str], path: Path) -> None:
    for key in env:
        if not ENV_NAME.match(key):
            raise EvalConfigError(
                f"Invalid env var name '{key}' in [env] of {path}: must match {ENV_NAME.pattern}"
            )
        if key.startswith(RESERVED_ENV_PREFIX):
            raise EvalConfigError(
                f"'{key}' in [env] of {path}: env var names starting with "
                f"{RESERVED_ENV_PREFIX} are reserved by the platform; choose a different name."
            )
    repeated = sorted({name for name in secrets if secrets.count(name) > 1})
    if repeated:
        raise EvalConfigError(
            f"Duplicate secret name(s) in [secrets].required of {path}: "
            f"{', '.join(repeated)}. Each name must appear once."
        )
    for name in secrets:
        if not SECRET_NAME.match(name):
            raise EvalConfigError(
                f"Invalid secret name '{name}' in {path}: use uppercase letters, digits, and "
                f"underscores, starting with a letter (e.g. MY_SECRET). Must match "
                f"{SECRET_NAME.pattern}."
            )
    both = sorted(set(env) & set(secrets))
    if both:
        raise EvalConfigError(
            f"Name(s) appear in both [env] and [secrets] of {path}: {', '.join(both)}. "
            "Each env var name must come from exactly one place."
        )


# --- resolving what the file names ------------------------------------------------------------


def workspace_of(path: Path) -> Path:
    """The nearest directory from ``path``'s upwards that holds a ``rollouts`` folder (else
    the current directory)."""
    for directory in [path.resolve().parent, *path.resolve().parents]:
        if (directory / "rollouts").is_dir():
            return directory
    return Path.cwd()


def _agent(experiment: _Experiment, workspace: Path) -> str:
    for label, name in (("rollout", experiment.rollout), ("entrypoint", experiment.entrypoint)):
        if not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise EvalConfigError(
                f"Evaluation {label} {name!r} must be a path inside the workspace."
            )
    entry = workspace / "rollouts" / experiment.rollout / experiment.entrypoint
    if not entry.is_file():
        raise EvalConfigError(f"Evaluation entrypoint {str(entry)!r} does not exist.")
    return str(entry)


def resolve_dataset(name: str, workspace: Path) -> Path:
    """A dataset file: ``name`` as a path (from here, then the workspace), else a file of that
    name in the workspace's ``datasets`` or ``data`` folder (the workspace template's)."""
    candidates = [Path(name), workspace / name]
    candidates += [
        workspace / folder / f"{name}{suffix}"
        for folder in DATASET_FOLDERS
        for suffix in DATASET_SUFFIXES
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise EvalConfigError(
        f"dataset {name!r} not found (looked for it as a file here, in {workspace} and in its "
        f"datasets and data folders); give a file with --dataset-file"
    )


def model_name(model_path: str) -> str:
    """The name an OpenAI-compatible endpoint knows: a LiteLLM ``openai/`` prefix dropped."""
    return model_path.removeprefix("openai/")


def load_eval_config(path: Path) -> EvalConfig:
    """Read and check an eval TOML; :class:`EvalConfigError` says what is wrong."""
    raw = _read(path)
    if "experiment" not in raw:
        raise EvalConfigError(f"Missing [experiment] section in {path}")
    experiment_table = _table(raw, "experiment", path)
    for key in ("rollout", "model_path", "dataset"):
        if key not in experiment_table:
            raise EvalConfigError(f"Missing '{key}' in [experiment] section of {path}")
    sections = _parse_sections(raw, path)
    env: dict[str, str] = _table(raw, "env", path)
    secrets = _secrets(raw, path)
    _check_names(env, secrets, path)
    experiment = cast(_Experiment, sections["experiment"])
    evaluation = cast(_Evaluation, sections["evaluation"])
    model, fleet = cast(_Model, sections["model"]), cast(_Fleet, sections["fleet"])
    workspace = workspace_of(path)
    return EvalConfig(
        agent=_agent(experiment, workspace),
        dataset=resolve_dataset(experiment.dataset, workspace),
        model=ModelEndpoint(
            model=model.model or model_name(experiment.model_path),
            base_url=model.base_url or OPENAI_BASE_URL,
            api_key_env=model.api_key_env or (None if model.base_url else "OPENAI_API_KEY"),
        ),
        limit=evaluation.limit,
        n=evaluation.n or 1,
        batch_size=evaluation.batch_size,
        pass_threshold=1.0 if evaluation.pass_threshold is None else evaluation.pass_threshold,
        agent_timeout_s=evaluation.agent_workflow_timeout_s,
        grader_timeout_s=evaluation.grader_timeout_s,
        env=dict(env),
        secrets=tuple(secrets),
        advanced=sections["advanced"].model_dump(),
        fleet=FleetTarget(**fleet.model_dump()),
        source=path,
    )


def require_secrets(config: EvalConfig) -> None:
    """Every ``[secrets]`` name is set in this environment (the agent reads them there)."""
    absent = [name for name in config.secrets if not os.environ.get(name)]
    if absent:
        raise EvalConfigError(f"[secrets] names not set in this environment: {', '.join(absent)}")


__all__ = [
    "EvalConfig",
    "EvalConfigError",
    "FleetTarget",
    "ModelEndpoint",
    "load_eval_config",
    "model_name",
    "require_secrets",
    "resolve_dataset",
    "workspace_of",
]
