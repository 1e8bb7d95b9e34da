"""A look at each model endpoint before a run starts anything.

An endpoint that cannot be reached, or refuses the key, would fail every work item the same
way, after a fleet was started for nothing; the run stops at once instead, with one line
naming the URL and the cause. The probe is ``GET {base_url}/models``: OpenAI, vLLM, SGLang,
LiteLLM and Ollama's OpenAI layer answer it, and any HTTP answer at all (a 404 from a server
without the route, like the mock TrainGate) proves the endpoint is there. Only no answer, or
401/403 (the key is wrong), stops the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from rollout_sdk.evaluation.config import ModelEndpoint
from rollout_sdk.localrun.bridge import unreachable

PROBE_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
REFUSED = {401: "refused the key (401)", 403: "refused the key (403)"}


class EndpointDown(Exception):
    """A model endpoint cannot serve the run; the message is the one line to print."""


async def _probe(role: str, endpoint: ModelEndpoint, http: httpx.AsyncClient) -> None:
    url = endpoint.base_url.rstrip("/")
    key = endpoint.api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        answer = await http.get(f"{url}/models", headers=headers)
    except httpx.HTTPError as exc:
        raise EndpointDown(f"{unreachable(url, exc)} ({role} model)") from None
    if answer.status_code in REFUSED:
        fix = f"check {endpoint.api_key_env}" if endpoint.api_key_env else "set --api-key-env"
        raise EndpointDown(
            f"the model endpoint {url} {REFUSED[answer.status_code]} ({role} model): {fix}"
        )


async def probe_endpoints(endpoints: Mapping[str, ModelEndpoint]) -> None:
    """Raise :class:`EndpointDown` for the first endpoint that cannot serve the run."""
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT) as http:
        await asyncio.gather(*(_probe(role, e, http) for role, e in endpoints.items()))


__all__ = ["EndpointDown", "probe_endpoints"]
