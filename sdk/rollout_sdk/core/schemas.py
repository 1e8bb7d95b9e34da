"""Pydantic models for every v1 wire shape (PROTOCOL.md §1) and the OpenAI tool schemas.

These models are the single source of truth: the in-process server, the fleet gateway,
the fleet workers and the mock TrainGate all parse and emit through them.
"""

from __future__ import annotations

import json
import threading
from enum import StrEnum
from typing import Any, TypedDict
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from rollout_sdk.config import DEFAULT_MAX_METADATA_SIZE_BYTES, get_settings
from rollout_sdk.core.answers import kept_message, kept_usage, message_problem
from rollout_sdk.utils import ensure_bearer_token, normalize_stop

MessageDict = dict[str, Any]
"""An OpenAI chat message (``role``, ``content``, optional ``tool_calls`` ...)."""


class SamplingParamsDict(TypedDict, total=False):
    """The sampling parameters a trainer usually sends in ``completion_params``."""

    temperature: float
    top_p: float
    max_tokens: int
    stop: str | list[str]
    logprobs: bool


# --- metadata size limit ---------------------------------------------------------------

_metadata_limit_lock = threading.Lock()
_metadata_limit_override: int | None = None


def get_max_metadata_size_bytes() -> int:
    """The metadata size limit: the override if set, else the settings' value."""
    with _metadata_limit_lock:
        if _metadata_limit_override is not None:
            return _metadata_limit_override
    return get_settings().max_metadata_size_bytes


def set_max_metadata_size_bytes(size: int) -> None:
    """Override the metadata size limit for this process."""
    global _metadata_limit_override  # noqa: PLW0603 - process-wide knob by spec
    if size <= 0:
        raise ValueError("max_metadata_size_bytes must be positive")
    with _metadata_limit_lock:
        _metadata_limit_override = size


def _check_metadata_size(metadata: dict[str, Any]) -> None:
    if not metadata:
        return
    limit = get_max_metadata_size_bytes()
    # Python-style json.dumps (default separators, ASCII escapes): the reference's measure.
    size = len(json.dumps(metadata))
    if size > limit:
        raise ValueError(
            f"metadata size exceeds maximum allowed size of {limit // 1_048_576}MB "
            f"({size} > {limit} bytes)"
        )


# --- rollout init ----------------------------------------------------------------------


def _check_rollout_id(value: str) -> str:
    if not value.strip():
        raise ValueError("rollout_id cannot be empty or whitespace only")
    return value


class RolloutRequest(BaseModel):
    """Body of ``POST /v1/rollout/init``."""

    rollout_id: str = Field(min_length=1, max_length=256)
    # The pattern only documents the check below (clients and fuzzers read the schema).
    server_url: str = Field(json_schema_extra={"format": "uri", "pattern": "^https?://[^/?#]+"})
    messages: list[MessageDict]
    completion_params: dict[str, Any]
    tool_server_url: str | None = None
    max_turns: int = 10
    max_tokens_total: int = 8192
    metadata: dict[str, Any] = Field(default_factory=dict)
    api_key: str | None = Field(default=None, repr=False)
    # A Redis key name like rollout_id: bounded as it is.
    idempotency_key: str | None = Field(default=None, max_length=256)

    _check_id = field_validator("rollout_id")(_check_rollout_id)

    @field_validator("api_key")
    @classmethod
    def _check_api_key(cls, value: str | None) -> str | None:
        return ensure_bearer_token(value, label="api_key")

    @field_validator("server_url")
    @classmethod
    def _check_server_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError("server_url must use http or https scheme")
        if not parts.hostname:
            raise ValueError("server_url must have a valid host")
        return value

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # A request admitted earlier (context {"admitted": True}) is not judged again.
        if not (info.context or {}).get("admitted"):
            _check_metadata_size(value)
        return value

    @property
    def idempotency_token(self) -> str:
        """The key that identifies this rollout for deduplication (P§1.3.1)."""
        return self.idempotency_key or self.rollout_id


# --- tool schemas ----------------------------------------------------------------------
# Unknown JSON-Schema keywords (items, minimum, nested objects...) are kept: extra="allow".


class OpenAIFunctionPropertySchema(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    # [decision] a missing description becomes "" instead of the reference's 500.
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(
        default_factory=OpenAIFunctionParametersSchema
    )
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A function call as the LLM emits it: ``arguments`` is a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A function call with decoded arguments."""

    name: str
    arguments: dict[str, Any]

    @classmethod
    def from_openai_function_parsed_schema(
        cls, parsed: OpenAIFunctionParsedSchema
    ) -> tuple[OpenAIFunctionCallSchema, bool]:
        """Decode ``parsed.arguments``; bad or non-object JSON gives ``{}`` and ``True``."""
        try:
            arguments = json.loads(parsed.arguments)
        except json.JSONDecodeError:
            return cls(name=parsed.name, arguments={}), True
        if not isinstance(arguments, dict):
            return cls(name=parsed.name, arguments={}), True
        return cls(name=parsed.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    id: str
    type: str = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """A tool's multimodal answer."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @field_validator("image", "video", mode="before")
    @classmethod
    def _require_list(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, list):
            raise ValueError("must be a list; wrap a single item in a list, e.g. [item]")
        return value

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video


class InitResponse(BaseModel):
    """202 body of ``POST /v1/rollout/init``."""

    rollout_id: str
    tools: list[OpenAIFunctionToolSchema] = Field(default_factory=list)


# --- TrainGate chat completions (outbound) ---------------------------------------------


class CompletionsRequest(BaseModel):
    """Body of ``POST {server_url}/v1/chat/completions``; sent with ``None`` fields omitted."""

    model: str = "default"
    messages: list[MessageDict]
    rollout_id: str = Field(min_length=1, max_length=256)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: list[str] | None = None
    logprobs: bool = True

    _check_id = field_validator("rollout_id")(_check_rollout_id)
    _normalize_stop = field_validator("stop", mode="before")(normalize_stop)


class CompletionUsage(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionsChoice(BaseModel):
    model_config = ConfigDict(extra="allow")

    index: int = 0
    message: MessageDict
    finish_reason: str | None = None

    @field_validator("message")
    @classmethod
    def _assistant_message(cls, message: MessageDict) -> MessageDict:
        """The OpenAI shape (``rollout_sdk.core.answers``), kept without fields of its own
        that hold lists or objects (they would be carried in every later prompt)."""
        if (problem := message_problem(message)) is not None:
            raise PydanticCustomError("answer_shape", problem)
        return kept_message(message)


class CompletionsResponse(BaseModel):
    """An OpenAI-shaped ``chat.completion`` as the TrainGate returns it (fields beyond these
    are not kept: a TrainGate's answer is untrusted bytes, and the turn keeps only these)."""

    model_config = ConfigDict(extra="ignore")

    id: str = ""
    object: str = "chat.completion"
    created: int = 0
    model: str = "default"
    choices: list[CompletionsChoice]
    usage: dict[str, Any] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None

    @field_validator("usage")
    @classmethod
    def _counts_only(cls, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        """Usage is counts: numbers, and objects of numbers one level down; the rest goes."""
        return None if usage is None else kept_usage(usage)


# --- completion callback (outbound) ----------------------------------------------------


class RolloutStatus(StrEnum):
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"


class RolloutMetrics(BaseModel):
    total_latency_ms: float = 0.0
    llm_latency_ms: float = 0.0
    tool_latency_ms: float = 0.0
    num_llm_calls: int = 0
    num_tool_calls: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    max_context_tokens: int = 0


class RolloutResponse(BaseModel):
    """Body of ``POST {server_url}/v1/rollout/completed``; sent with ``None`` fields omitted."""

    rollout_id: str
    status: RolloutStatus
    final_messages: list[MessageDict] = Field(default_factory=list)
    finish_reason: str | None = None
    error_message: str | None = None
    reward: float | None = None
    metrics: RolloutMetrics | None = None
    extra_fields: dict[str, Any] = Field(default_factory=dict)

    def wire_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


class HealthResponse(BaseModel):
    """Body of v1 ``GET /health`` and ``GET /platform/health``."""

    status: str = "healthy"
    agent_loop: str
    active_rollouts: int
    completed_rollouts: int


__all__ = [
    "DEFAULT_MAX_METADATA_SIZE_BYTES",
    "CompletionUsage",
    "CompletionsChoice",
    "CompletionsRequest",
    "CompletionsResponse",
    "HealthResponse",
    "InitResponse",
    "MessageDict",
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolCall",
    "OpenAIFunctionToolSchema",
    "RolloutMetrics",
    "RolloutRequest",
    "RolloutResponse",
    "RolloutStatus",
    "SamplingParamsDict",
    "ToolResponse",
    "get_max_metadata_size_bytes",
    "set_max_metadata_size_bytes",
]
