"""Static checks of an agent before it serves traffic: a v1 agent loop (SDK.md §1.10) or a
v2 workflow with its grader (the seed's ``validate_backend`` codes, SDK.md §2.7)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from rollout_sdk.agent_workflow import AgentWorkflow
from rollout_sdk.backend.execution import WorkflowBundle
from rollout_sdk.core.base import RolloutAgentLoop
from rollout_sdk.core.schemas import OpenAIFunctionToolSchema, RolloutRequest
from rollout_sdk.grader import Grader

MAX_AGENT_NAME = 256


@dataclass
class ValidationError:
    """One problem found in an agent loop."""

    code: str
    message: str
    field: str | None = None
    details: dict[str, Any] | None = None

    def __str__(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"[{self.code}] {where}{self.message}"


class AgentLoopValidationError(Exception):
    """Raised by :meth:`ValidationResult.raise_if_invalid`."""

    def __init__(self, errors: list[ValidationError]) -> None:
        lines = "\n".join(f"  - {error}" for error in errors)
        super().__init__(f"Agent loop validation failed with {len(errors)} error(s):\n{lines}")
        self.errors = errors


@dataclass
class ValidationResult:
    valid: bool
    errors: list[ValidationError] = field(default_factory=list)
    warnings: list[ValidationError] = field(default_factory=list)
    agent_name: str | None = None
    tool_count: int = 0

    def __bool__(self) -> bool:
        return self.valid

    def raise_if_invalid(self) -> None:
        if not self.valid:
            raise AgentLoopValidationError(self.errors)


def default_validation_request() -> RolloutRequest:
    return RolloutRequest(
        rollout_id="validation-test-rollout",
        server_url="http://localhost:8080",
        messages=[{"role": "user", "content": "Hello"}],
        completion_params={"temperature": 1.0, "max_tokens": 512},
        metadata={"_validation": True},
    )


class _Checker:
    def __init__(self) -> None:
        self.errors: list[ValidationError] = []
        self.warnings: list[ValidationError] = []

    def error(self, code: str, message: str, where: str | None = None, **details: Any) -> None:
        self.errors.append(ValidationError(code, message, where, details or None))

    def warn(self, code: str, message: str, where: str | None = None) -> None:
        self.warnings.append(ValidationError(code, message, where))

    def check_name(self, agent_loop: Any) -> str | None:
        if not hasattr(agent_loop, "name"):
            self.error("MISSING_NAME", "agent loop has no 'name' attribute", "name")
            return None
        name = agent_loop.name
        if not isinstance(name, str):
            self.error("INVALID_NAME_TYPE", f"name must be a string, got {type(name).__name__}")
            return None
        if not name.strip():
            self.error("EMPTY_NAME", "name must not be blank", "name")
        return name

    def check_tools(self, agent_loop: Any, request: RolloutRequest) -> int:
        try:
            tools = agent_loop.get_tools(request)
        except Exception as exc:
            self.error(
                "GET_TOOLS_EXCEPTION",
                f"get_tools raised {type(exc).__name__}: {exc}",
                "get_tools",
                exception_type=type(exc).__name__,
                exception_message=str(exc),
            )
            return 0
        if tools is None:
            self.error("GET_TOOLS_RETURNS_NONE", "get_tools returned None; return [] instead")
            return 0
        if not isinstance(tools, list):
            self.error(
                "GET_TOOLS_INVALID_TYPE",
                f"get_tools must return a list, got {type(tools).__name__}",
            )
            return 0
        for index, tool in enumerate(tools):
            self.check_tool(tool, f"tools[{index}]")
        return len(tools)

    def check_tool(self, tool: Any, where: str) -> None:
        if isinstance(tool, OpenAIFunctionToolSchema):
            return
        if not isinstance(tool, dict):
            self.error(
                "INVALID_TOOL_TYPE",
                f"a tool must be a dict or schema object, got {type(tool).__name__}",
                where,
            )
            return
        errors_before = len(self.errors)
        if "type" not in tool:
            self.error("MISSING_TOOL_TYPE", "tool has no 'type'", where)
        elif tool["type"] != "function":
            self.warn("UNKNOWN_TOOL_TYPE", f"tool type {tool['type']!r} is not 'function'", where)
        if "function" not in tool:
            self.error("MISSING_FUNCTION", "tool has no 'function'", where)
            return
        function = tool["function"]
        if not isinstance(function, dict):
            self.error("INVALID_FUNCTION_TYPE", "'function' must be a dict", f"{where}.function")
            return
        self.check_function(function, f"{where}.function")
        if len(self.errors) == errors_before:
            try:
                OpenAIFunctionToolSchema.model_validate(tool)
            except PydanticValidationError as exc:
                self.error("INVALID_TOOL_SCHEMA", f"tool schema rejected: {exc}", where)

    def check_function(self, function: dict[str, Any], where: str) -> None:
        if "name" not in function:
            self.error("MISSING_FUNCTION_NAME", "function has no 'name'", where)
        elif not isinstance(function["name"], str) or not function["name"]:
            self.error("INVALID_FUNCTION_NAME", "function name must be a non-empty string", where)
        if "description" not in function:
            self.warn(
                "MISSING_FUNCTION_DESCRIPTION",
                "function has no 'description' (the upstream server answers 500 for this tool; "
                'Rollout Fleet sends "")',
                where,
            )
        if "parameters" in function:
            parameters = function["parameters"]
            if not isinstance(parameters, dict):
                self.error("INVALID_PARAMETERS_TYPE", "'parameters' must be a dict", where)
            elif parameters.get("type") != "object":
                self.warn(
                    "PARAMETERS_TYPE_NOT_OBJECT", "'parameters.type' should be 'object'", where
                )

    def check_run(self, agent_loop: Any) -> None:
        run = getattr(agent_loop, "run", None)
        if run is None:
            self.error("MISSING_RUN_METHOD", "agent loop has no 'run' method", "run")
        elif not callable(run):
            self.error("RUN_NOT_CALLABLE", "'run' is not callable", "run")
        elif not inspect.iscoroutinefunction(run):
            self.error("RUN_NOT_ASYNC", "'run' must be defined with 'async def'", "run")


def validate_agent_loop(
    agent_loop: RolloutAgentLoop | Any, *, request: RolloutRequest | None = None
) -> ValidationResult:
    """Check name, tools and ``run`` of an agent loop; never raises for agent mistakes."""
    checker = _Checker()
    name = checker.check_name(agent_loop)
    tool_count = checker.check_tools(agent_loop, request or default_validation_request())
    checker.check_run(agent_loop)
    return ValidationResult(
        valid=not checker.errors,
        errors=checker.errors,
        warnings=checker.warnings,
        agent_name=name,
        tool_count=tool_count,
    )


def _concrete(cls: Any, base: type) -> bool:
    return inspect.isclass(cls) and issubclass(cls, base) and not inspect.isabstract(cls)


def _check_instantiates(checker: _Checker, cls: type, config: Any, code: str, what: str) -> None:
    try:
        cls(config)
    except Exception as exc:
        checker.error(
            code,
            f"{cls.__name__}({'config' if config is not None else ''}) raised "
            f"{type(exc).__name__}: {exc}; a fresh {what} is built for every rollout",
            exception_type=type(exc).__name__,
            exception_message=str(exc),
        )


def validate_workflow(bundle: WorkflowBundle, *, require_grader: bool = True) -> ValidationResult:
    """Check a v2 agent: a concrete workflow class whose ``run`` is async and which builds
    with its config, a name of 1-256 characters, and (for training) a concrete grader whose
    ``grade`` is async. Every problem is reported, none raised."""
    checker = _Checker()
    workflow = bundle.workflow_cls
    if not _concrete(workflow, AgentWorkflow):
        checker.error(
            "INVALID_WORKFLOW_CLASS",
            f"{workflow!r} is not a concrete AgentWorkflow subclass (is 'run' implemented?)",
        )
    else:
        if not inspect.iscoroutinefunction(workflow.run):
            checker.error(
                "WORKFLOW_RUN_NOT_ASYNC", f"{workflow.__name__}.run must be 'async def run(...)'"
            )
        _check_instantiates(
            checker, workflow, bundle.workflow_config, "WORKFLOW_INIT_FAILED", "workflow"
        )
    name = bundle.name if isinstance(bundle.name, str) else None
    if name is None or not 1 <= len(name.strip()) <= MAX_AGENT_NAME:
        checker.error(
            "INVALID_AGENT_NAME",
            f"the agent's name {bundle.name!r} (its workflow config's name, else the workflow "
            f"class's) must be 1 to {MAX_AGENT_NAME} characters",
        )
    grader = bundle.grader_cls
    if grader is None:
        if require_grader:
            checker.error(
                "MISSING_GRADER",
                "no Grader subclass found: training needs one to reward each rollout",
            )
    elif not _concrete(grader, Grader):
        checker.error(
            "INVALID_GRADER_CLASS",
            f"{grader!r} is not a concrete Grader subclass (is 'grade' implemented?)",
        )
    else:
        if not inspect.iscoroutinefunction(grader.grade):
            checker.error(
                "GRADER_GRADE_NOT_ASYNC", f"{grader.__name__}.grade must be 'async def grade(...)'"
            )
        _check_instantiates(checker, grader, bundle.grader_config, "GRADER_INIT_FAILED", "grader")
    return ValidationResult(
        valid=not checker.errors,
        errors=checker.errors,
        warnings=checker.warnings,
        agent_name=name,
    )


__all__ = [
    "AgentLoopValidationError",
    "ValidationError",
    "ValidationResult",
    "validate_agent_loop",
    "validate_workflow",
]
