"""Rollout SDK: write an agent once, run it on Rollout Fleet (Osmosis remote-rollout compatible).

Every public name is resolved lazily, so ``import rollout_sdk`` (or the ``osmosis_ai``
alias) stays cheap and never imports FastAPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # v1 agent API
    "RolloutAgentLoop": "rollout_sdk.core.base",
    "RolloutContext": "rollout_sdk.core.base",
    "RolloutResult": "rollout_sdk.core.base",
    # wire models
    "RolloutRequest": "rollout_sdk.core.schemas",
    "RolloutResponse": "rollout_sdk.core.schemas",
    "RolloutStatus": "rollout_sdk.core.schemas",
    "RolloutMetrics": "rollout_sdk.core.schemas",
    "InitResponse": "rollout_sdk.core.schemas",
    "CompletionsRequest": "rollout_sdk.core.schemas",
    "CompletionsResponse": "rollout_sdk.core.schemas",
    "CompletionsChoice": "rollout_sdk.core.schemas",
    "CompletionUsage": "rollout_sdk.core.schemas",
    "OpenAIFunctionToolSchema": "rollout_sdk.core.schemas",
    "OpenAIFunctionSchema": "rollout_sdk.core.schemas",
    "OpenAIFunctionParametersSchema": "rollout_sdk.core.schemas",
    "OpenAIFunctionPropertySchema": "rollout_sdk.core.schemas",
    "OpenAIFunctionParsedSchema": "rollout_sdk.core.schemas",
    "OpenAIFunctionCallSchema": "rollout_sdk.core.schemas",
    "OpenAIFunctionToolCall": "rollout_sdk.core.schemas",
    "ToolResponse": "rollout_sdk.core.schemas",
    "MessageDict": "rollout_sdk.core.schemas",
    "SamplingParamsDict": "rollout_sdk.core.schemas",
    "DEFAULT_MAX_METADATA_SIZE_BYTES": "rollout_sdk.core.schemas",
    "get_max_metadata_size_bytes": "rollout_sdk.core.schemas",
    "set_max_metadata_size_bytes": "rollout_sdk.core.schemas",
    # TrainGate client
    "OsmosisLLMClient": "rollout_sdk.client",
    "CompletionsResult": "rollout_sdk.client",
    "LLMClientProtocol": "rollout_sdk.core.llm_client",
    # exceptions
    "OsmosisRolloutError": "rollout_sdk.core.exceptions",
    "OsmosisTransportError": "rollout_sdk.core.exceptions",
    "OsmosisServerError": "rollout_sdk.core.exceptions",
    "OsmosisValidationError": "rollout_sdk.core.exceptions",
    "OsmosisTimeoutError": "rollout_sdk.core.exceptions",
    "AgentLoopNotFoundError": "rollout_sdk.core.exceptions",
    "ToolExecutionError": "rollout_sdk.core.exceptions",
    "ToolArgumentError": "rollout_sdk.core.exceptions",
    # tools
    "create_tool_result": "rollout_sdk.tools",
    "create_tool_error_result": "rollout_sdk.tools",
    "serialize_tool_result": "rollout_sdk.tools",
    "parse_tool_arguments": "rollout_sdk.tools",
    "get_tool_call_info": "rollout_sdk.tools",
    "execute_tool_calls": "rollout_sdk.tools",
    # servers
    "create_app": "rollout_sdk.server",
    "serve_agent_loop": "rollout_sdk.server",
    "validate_and_report": "rollout_sdk.server",
    "ServeError": "rollout_sdk.server",
    # settings
    "RolloutSettings": "rollout_sdk.config",
    "RolloutClientSettings": "rollout_sdk.config",
    "RolloutServerSettings": "rollout_sdk.config",
    "get_settings": "rollout_sdk.config",
    "configure": "rollout_sdk.config",
    "reset_settings": "rollout_sdk.config",
    # validation and registry
    "validate_agent_loop": "rollout_sdk.validator",
    "ValidationResult": "rollout_sdk.validator",
    "ValidationError": "rollout_sdk.validator",
    "AgentLoopValidationError": "rollout_sdk.validator",
    "AgentLoopRegistry": "rollout_sdk.registry",
    "register_agent_loop": "rollout_sdk.registry",
    "unregister_agent_loop": "rollout_sdk.registry",
    "get_agent_loop": "rollout_sdk.registry",
    "list_agent_loops": "rollout_sdk.registry",
    # rewards
    "osmosis_reward": "rollout_sdk.rewards",
    # v2: workflows, graders, backends (RolloutContext/RolloutStatus above stay the v1 ones
    # the seed docs import; the v2 ones live in rollout_sdk.context / rollout_sdk.types)
    "AgentWorkflow": "rollout_sdk.agent_workflow",
    "Grader": "rollout_sdk.grader",
    "AgentWorkflowContext": "rollout_sdk.context",
    "GraderContext": "rollout_sdk.context",
    "SampleSource": "rollout_sdk.context",
    "get_rollout_context": "rollout_sdk.context",
    "AgentWorkflowConfig": "rollout_sdk.types",
    "AgentWorkflowOutput": "rollout_sdk.types",
    "BaseConfig": "rollout_sdk.types",
    "ConcurrencyConfig": "rollout_sdk.types",
    "GraderConfig": "rollout_sdk.types",
    "ExecutionOutcome": "rollout_sdk.types",
    "ExecutionRequest": "rollout_sdk.types",
    "ExecutionResult": "rollout_sdk.types",
    "RolloutErrorCategory": "rollout_sdk.types",
    "RolloutInitRequest": "rollout_sdk.types",
    "RolloutInitResponse": "rollout_sdk.types",
    "RolloutResultResponse": "rollout_sdk.types",
    "RolloutSample": "rollout_sdk.types",
    "ExecutionBackend": "rollout_sdk.backend",
    "LocalBackend": "rollout_sdk.backend",
    "create_rollout_server": "rollout_sdk.server",
    # seed shape: the Strands integration is also reachable from the top level
    "OsmosisRolloutModel": "rollout_sdk.integrations.agents.strands",
    "OsmosisStrandsAgent": "rollout_sdk.integrations.agents.strands",
}

if TYPE_CHECKING:
    from rollout_sdk.agent_workflow import AgentWorkflow
    from rollout_sdk.backend import ExecutionBackend, LocalBackend
    from rollout_sdk.client import CompletionsResult, OsmosisLLMClient
    from rollout_sdk.config import (
        RolloutClientSettings,
        RolloutServerSettings,
        RolloutSettings,
        configure,
        get_settings,
        reset_settings,
    )
    from rollout_sdk.context import (
        AgentWorkflowContext,
        GraderContext,
        SampleSource,
        get_rollout_context,
    )
    from rollout_sdk.core.base import RolloutAgentLoop, RolloutContext, RolloutResult
    from rollout_sdk.core.exceptions import (
        AgentLoopNotFoundError,
        OsmosisRolloutError,
        OsmosisServerError,
        OsmosisTimeoutError,
        OsmosisTransportError,
        OsmosisValidationError,
        ToolArgumentError,
        ToolExecutionError,
    )
    from rollout_sdk.core.llm_client import LLMClientProtocol
    from rollout_sdk.core.schemas import (
        DEFAULT_MAX_METADATA_SIZE_BYTES,
        CompletionsChoice,
        CompletionsRequest,
        CompletionsResponse,
        CompletionUsage,
        InitResponse,
        MessageDict,
        OpenAIFunctionCallSchema,
        OpenAIFunctionParametersSchema,
        OpenAIFunctionParsedSchema,
        OpenAIFunctionPropertySchema,
        OpenAIFunctionSchema,
        OpenAIFunctionToolCall,
        OpenAIFunctionToolSchema,
        RolloutMetrics,
        RolloutRequest,
        RolloutResponse,
        RolloutStatus,
        SamplingParamsDict,
        ToolResponse,
        get_max_metadata_size_bytes,
        set_max_metadata_size_bytes,
    )
    from rollout_sdk.grader import Grader
    from rollout_sdk.integrations.agents.strands import OsmosisRolloutModel, OsmosisStrandsAgent
    from rollout_sdk.registry import (
        AgentLoopRegistry,
        get_agent_loop,
        list_agent_loops,
        register_agent_loop,
        unregister_agent_loop,
    )
    from rollout_sdk.rewards import osmosis_reward
    from rollout_sdk.server import (
        ServeError,
        create_app,
        create_rollout_server,
        serve_agent_loop,
        validate_and_report,
    )
    from rollout_sdk.tools import (
        create_tool_error_result,
        create_tool_result,
        execute_tool_calls,
        get_tool_call_info,
        parse_tool_arguments,
        serialize_tool_result,
    )
    from rollout_sdk.types import (
        AgentWorkflowConfig,
        AgentWorkflowOutput,
        BaseConfig,
        ConcurrencyConfig,
        ExecutionOutcome,
        ExecutionRequest,
        ExecutionResult,
        GraderConfig,
        RolloutErrorCategory,
        RolloutInitRequest,
        RolloutInitResponse,
        RolloutResultResponse,
        RolloutSample,
    )
    from rollout_sdk.validator import (
        AgentLoopValidationError,
        ValidationError,
        ValidationResult,
        validate_agent_loop,
    )


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'rollout_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "DEFAULT_MAX_METADATA_SIZE_BYTES",
    "AgentLoopNotFoundError",
    "AgentLoopRegistry",
    "AgentLoopValidationError",
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "BaseConfig",
    "CompletionUsage",
    "CompletionsChoice",
    "CompletionsRequest",
    "CompletionsResponse",
    "CompletionsResult",
    "ConcurrencyConfig",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "InitResponse",
    "LLMClientProtocol",
    "LocalBackend",
    "MessageDict",
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolCall",
    "OpenAIFunctionToolSchema",
    "OsmosisLLMClient",
    "OsmosisRolloutError",
    "OsmosisRolloutModel",
    "OsmosisServerError",
    "OsmosisStrandsAgent",
    "OsmosisTimeoutError",
    "OsmosisTransportError",
    "OsmosisValidationError",
    "RolloutAgentLoop",
    "RolloutClientSettings",
    "RolloutContext",
    "RolloutErrorCategory",
    "RolloutInitRequest",
    "RolloutInitResponse",
    "RolloutMetrics",
    "RolloutRequest",
    "RolloutResponse",
    "RolloutResult",
    "RolloutResultResponse",
    "RolloutSample",
    "RolloutServerSettings",
    "RolloutSettings",
    "RolloutStatus",
    "SampleSource",
    "SamplingParamsDict",
    "ServeError",
    "ToolArgumentError",
    "ToolExecutionError",
    "ToolResponse",
    "ValidationError",
    "ValidationResult",
    "configure",
    "create_app",
    "create_rollout_server",
    "create_tool_error_result",
    "create_tool_result",
    "execute_tool_calls",
    "get_agent_loop",
    "get_max_metadata_size_bytes",
    "get_rollout_context",
    "get_settings",
    "get_tool_call_info",
    "list_agent_loops",
    "osmosis_reward",
    "parse_tool_arguments",
    "register_agent_loop",
    "reset_settings",
    "serialize_tool_result",
    "serve_agent_loop",
    "set_max_metadata_size_bytes",
    "unregister_agent_loop",
    "validate_agent_loop",
    "validate_and_report",
]
