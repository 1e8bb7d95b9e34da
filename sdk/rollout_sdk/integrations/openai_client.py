"""The OpenAI-compatible client the integrations use to reach the TrainGate.

Rollouts on one event loop share a few ``AsyncOpenAI`` clients, each over its own connection
pool, one picked per rollout (small pools: see :class:`~rollout_sdk.client.HttpClientShards`);
each rollout gets a cheap ``with_options`` view carrying its base URL, its key and the
``x-rollout-id`` / ``x-sample-id`` headers (ids that are not plain header-safe ASCII
percent-encoded: ``rollout_sdk.client.headers``). A client must not cross event loops, hence
clients per loop.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import weakref
import zlib
from typing import Any

import httpx

# The client imports its resources lazily, on first use: on the event loop, where importing
# them (compiling them, on an install without bytecode) would block every rollout of a worker
# for seconds. Importing them with this module moves that to agent loading.
import openai.resources  # noqa: F401
from openai import APIStatusError, AsyncOpenAI

from rollout_sdk.client.headers import llm_call_headers
from rollout_sdk.client.traingate import new_http_client
from rollout_sdk.config import get_settings
from rollout_sdk.context import RolloutContext
from rollout_sdk.core.answers import check_chunk, check_completion
from rollout_sdk.core.foreign import answered

ROLLOUT_MODEL_NAME = "osmosis-rollout"  # a placeholder: the TrainGate serves its policy

# Rollouts of a loop are spread over this many clients (made as first needed).
CLIENTS_PER_LOOP = 64

_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)


# Stands for "this rollout has no key". Passing it explicitly also keeps a stray
# OPENAI_API_KEY in the environment from ever reaching the TrainGate.
NO_KEY = "rollout-sdk:no-key"


class TrainGateOpenAI(AsyncOpenAI):
    """``AsyncOpenAI`` for a TrainGate, which may run without auth: no key, no header."""

    @property
    def auth_headers(self) -> dict[str, str]:
        return {} if self.api_key == NO_KEY else super().auth_headers

    @property
    def _bearer_auth(self) -> dict[str, str]:
        return {} if self.api_key == NO_KEY else super()._bearer_auth

    def _validate_headers(self, headers: Any, custom_headers: Any) -> None:
        return None  # openai insists on an Authorization header; a keyless TrainGate does not

    def _process_response_data(
        self, *, data: object, cast_to: type[Any], response: httpx.Response
    ) -> Any:
        """A chat answer (whole, or each streamed chunk) is checked against the OpenAI shape
        before the agent's framework sees it (``rollout_sdk.core.answers``)."""
        name = getattr(cast_to, "__name__", "")
        if name == "ChatCompletion":
            check_completion(data)
        elif name == "ChatCompletionChunk":
            check_chunk(data)
        return super()._process_response_data(data=data, cast_to=cast_to, response=response)

    def _make_status_error(
        self, err_msg: str, *, body: object, response: httpx.Response
    ) -> APIStatusError:
        """The error says the status only (openai's says the body, which becomes the rollout's
        error message); ``body`` stays on it for frameworks that read its error code."""
        return super()._make_status_error(answered(response), body=body, response=response)


@functools.cache
def _tls() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def _new_client() -> AsyncOpenAI:
    """Timeout, retries and pool size follow the SDK's client settings
    (``OSMOSIS_ROLLOUT_CLIENT_*``), as the v1 TrainGate client does; the OpenAI client retries
    transport errors, timeouts, 429 and 5xx itself."""
    settings = get_settings()
    return TrainGateOpenAI(
        api_key=NO_KEY,
        base_url="http://unset.invalid",
        max_retries=settings.client.max_retries,
        http_client=new_http_client(settings, _tls()),
    )


def shared_client(rollout_id: str = "") -> AsyncOpenAI:
    """The running loop's client for ``rollout_id`` (the same one for all its calls)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return _new_client()
    clients = _shared.setdefault(loop, {})
    shard = zlib.crc32(rollout_id.encode()) % CLIENTS_PER_LOOP
    client = clients.get(shard)
    if client is None:
        client = clients[shard] = _new_client()
    return client


def rollout_headers(ctx: RolloutContext, sample_id: str | None) -> dict[str, str]:
    """``x-rollout-id`` and (with ``sample_id``) ``x-sample-id``, each id percent-encoded
    unless it is plain header-safe ASCII (``rollout_sdk.client.headers``, P§2.11)."""
    return llm_call_headers(ctx.rollout_id, sample_id)


def rollout_client(ctx: RolloutContext, sample_id: str | None = None) -> AsyncOpenAI:
    """A client bound to this rollout's TrainGate URL, key and attribution headers.

    Without a rollout key no ``Authorization`` header is sent at all (P§2.11).
    """
    return shared_client(ctx.rollout_id).with_options(
        base_url=ctx.chat_completions_url,
        api_key=ctx.api_key or NO_KEY,
        default_headers=rollout_headers(ctx, sample_id),
    )


__all__ = [
    "NO_KEY",
    "ROLLOUT_MODEL_NAME",
    "TrainGateOpenAI",
    "rollout_client",
    "rollout_headers",
    "shared_client",
]
