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
}

if TYPE_CHECKING:
    from rollout_sdk.client import CompletionsResult, OsmosisLLMClient
    from rollout_sdk.config import (
        RolloutClientSettings,
        RolloutServerSettings,
        RolloutSettings,
        configure,
        get_settings,
        reset_settings,
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
    "CompletionUsage",
    "CompletionsChoice",
    "CompletionsRequest",
    "CompletionsResponse",
    "CompletionsResult",
    "InitResponse",
    "LLMClientProtocol",
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
    "OsmosisServerError",
    "OsmosisTimeoutError",
    "OsmosisTransportError",
    "OsmosisValidationError",
    "RolloutAgentLoop",
    "RolloutClientSettings",
    "RolloutContext",
    "RolloutMetrics",
    "RolloutRequest",
    "RolloutResponse",
    "RolloutResult",
    "RolloutServerSettings",
    "RolloutSettings",
    "RolloutStatus",
    "SamplingParamsDict",
    "ServeError",
    "ToolArgumentError",
    "ToolExecutionError",
    "ToolResponse",
    "ValidationError",
    "ValidationResult",
    "configure",
    "create_app",
    "create_tool_error_result",
    "create_tool_result",
    "execute_tool_calls",
    "get_agent_loop",
    "get_max_metadata_size_bytes",
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
