"""The OpenAI Agents SDK on a rollout (SDK.md §2.11).

``OsmosisAgent(model=OsmosisRolloutModel(), ...)`` runs on :class:`OsmosisChatModel`: the
SDK's own chat-completions model over the loop's shared OpenAI client, pointed at the
rollout's TrainGate (no litellm). ``OsmosisMemorySession`` records the conversation and is
the rollout's sample source; every model call names it in ``x-sample-id``.

Importing this module turns the Agents SDK's trace export off (it would send every training
conversation to OpenAI); set ``ROLLOUT_SDK_AGENTS_TRACING=1`` to keep it.
"""

from __future__ import annotations

import copy
import logging
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

from rollout_sdk.integrations._imports import missing_extra

try:
    from agents import Agent, set_tracing_disabled
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.memory.session import SessionABC
    from agents.model_settings import ModelSettings
    from agents.models.chatcmpl_converter import Converter
    from agents.models.interface import Model
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.usage import Usage
except ModuleNotFoundError as _exc:
    missing_extra(_exc, extra="openai-agents", feature="The OpenAI Agents integration")

from rollout_sdk.context import RolloutContext, SampleSource, get_rollout_context
from rollout_sdk.integrations.openai_client import (
    ROLLOUT_MODEL_NAME,
    rollout_client,
    rollout_headers,
)
from rollout_sdk.types.sample import RolloutSample

logger = logging.getLogger(__name__)

if os.environ.get("ROLLOUT_SDK_AGENTS_TRACING") != "1":
    set_tracing_disabled(True)

_PLACEHOLDER_ERROR = (
    "OsmosisRolloutModel is a placeholder. Wrap your agent with OsmosisAgent so the model "
    "is bound to the active RolloutContext."
)


class SessionSampleSource(SampleSource):
    """The sample is the session's persisted Responses-API items (the runner's own shape);
    a best-effort chat-format copy goes to the trajectory."""

    def __init__(self, session: SessionABC) -> None:
        self.session = session

    async def get_sample(self, *args: Any) -> RolloutSample:
        items = await self.session.get_items()
        trajectory = _chat_messages(items)
        if trajectory is None:
            logger.warning("could not convert session items for the trajectory")
        return RolloutSample(messages=cast(Any, items), trajectory_messages=trajectory)

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        """The newest session items for live previews (the turn count only for our own
        in-memory session, which holds every item)."""
        if max_messages <= 0:
            return None
        recent = await self.session.get_items(limit=max_messages + 1)
        items = copy.deepcopy(recent[-max_messages:])
        trajectory = _chat_messages(items)
        if trajectory is None:  # a preview is optional; the final trajectory logs the failure
            return None
        turn = None
        if isinstance(self.session, OsmosisMemorySession):
            turn = sum(_is_model_reply(item) for item in self.session.items)
        return RolloutSample(
            messages=cast(Any, items),
            trajectory_messages=trajectory,
            extra_fields={"_preview_truncated": len(recent) > max_messages, "_preview_turn": turn},
        )


def _chat_messages(items: list[TResponseInputItem]) -> list[dict[str, Any]] | None:
    """A best-effort chat-format copy of session items (``None`` when they do not convert:
    archiving must never fail a rollout)."""
    try:
        return [
            dict(message)
            for message in Converter.items_to_messages(
                cast(Any, items), preserve_tool_output_all_content=True
            )
        ]
    except Exception:
        return None


def _is_model_reply(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "assistant"


class OsmosisMemorySession(SessionABC):
    """In-memory session; constructed inside a rollout it registers as the sample source
    (its name becomes the sample id). Outside any rollout it is a plain session."""

    def __init__(self, name: str | None = None) -> None:
        self.session_id: str = name or uuid.uuid4().hex
        self.session_settings = None
        self.items: list[TResponseInputItem] = []
        self._context: RolloutContext | None = get_rollout_context()
        if self._context is not None:
            self._context.register_sample_source(self.session_id, SessionSampleSource(self))

    def _check_context(self) -> None:
        ctx = get_rollout_context()
        if ctx is None or ctx is self._context:
            if ctx is not None:
                ctx.current_sample_id = self.session_id
            return
        raise RuntimeError(
            "OsmosisMemorySession was used inside a RolloutContext it was not registered "
            "with. Construct the session inside the workflow run."
        )

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        self._check_context()
        return list(self.items) if limit is None else list(self.items[-limit:])

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        self._check_context()
        self.items.extend(items)

    async def pop_item(self) -> TResponseInputItem | None:
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        self.items.clear()


class OsmosisRolloutModel(Model):
    """A placeholder for the policy; ``OsmosisAgent`` swaps in :class:`OsmosisChatModel`,
    with these keyword arguments (``stream=False`` for plain JSON calls). Sampling options
    belong in ``ModelSettings``, so it is usually built with no arguments."""

    def __init__(self, **model_kwargs: Any) -> None:
        self.model_kwargs = model_kwargs

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise NotImplementedError(_PLACEHOLDER_ERROR)

    async def stream_response(
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError(_PLACEHOLDER_ERROR)
        yield  # pragma: no cover - makes this an async generator like Model.stream_response


class OsmosisChatModel(OpenAIChatCompletionsModel):
    """Chat completions against the active rollout's TrainGate, streamed (``stream=False``:
    plain JSON calls, except for ``Runner.run_streamed``, which streams).

    Refuses to call the policy until a session is registered: without one the grader would
    get an empty sample.
    """

    def __init__(self, *, stream: bool = True, **model_kwargs: Any) -> None:
        ctx = get_rollout_context()
        if ctx is None:
            raise RuntimeError(
                "OsmosisChatModel needs an active RolloutContext: construct it (or OsmosisAgent) "
                "inside the workflow run, where the execution backend has set the context up"
            )
        self._rollout = ctx
        self._stream = stream
        # Attribution headers go on per call (the session naming the sample may change).
        client = rollout_client(ctx)
        super().__init__(model=model_kwargs.pop("model", ROLLOUT_MODEL_NAME), openai_client=client)

    def _merge_headers(self, model_settings: ModelSettings) -> dict[str, str]:
        ctx = self._rollout
        if not ctx.sample_sources:
            raise RuntimeError(
                "OsmosisChatModel was called without an OsmosisMemorySession. Pass "
                "`session=OsmosisMemorySession()` to Runner.run() so the conversation is "
                "recorded for grading."
            )
        sample_id = ctx.current_sample_id or next(iter(ctx.sample_sources))
        headers: dict[str, str] = super()._merge_headers(model_settings)
        return {**headers, **rollout_headers(ctx, sample_id)}

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """Served by consuming the stream, so the TrainGate sees streaming calls (unless built
        with ``stream=False``)."""
        if not self._stream:
            return await super().get_response(*args, **kwargs)
        output: list[Any] = []
        usage = Usage()
        async for event in self.stream_response(*args, **kwargs):
            if event.type == "response.completed":
                output = list(event.response.output)
                if event.response.usage:
                    final = event.response.usage
                    usage = Usage(
                        requests=1,
                        input_tokens=final.input_tokens,
                        output_tokens=final.output_tokens,
                        total_tokens=final.total_tokens,
                        input_tokens_details=final.input_tokens_details,
                        output_tokens_details=final.output_tokens_details,
                    )
        return ModelResponse(output=output, usage=usage, response_id=None)


OsmosisLitellmModel = OsmosisChatModel  # the upstream name (it used litellm; we do not)


class OsmosisAgent(Agent):
    """``agents.Agent`` that binds an ``OsmosisRolloutModel`` to the active rollout."""

    def __init__(self, *args: Any, model: Any = None, **kwargs: Any) -> None:
        if isinstance(model, OsmosisRolloutModel):
            model = OsmosisChatModel(**model.model_kwargs)
        # Same signature as Agent (a dataclass): model is keyword-only here by design.
        super().__init__(*args, model=model, **kwargs)  # type: ignore[misc]


__all__ = [
    "OsmosisAgent",
    "OsmosisChatModel",
    "OsmosisLitellmModel",
    "OsmosisMemorySession",
    "OsmosisRolloutModel",
    "SessionSampleSource",
]
