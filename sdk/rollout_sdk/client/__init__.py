"""Clients: the TrainGate client v1 rollouts use, and the trainer's v2 ``RolloutClient``."""

from rollout_sdk.client.trainer import (
    RolloutAdmissionTimeoutError,
    RolloutClient,
    RolloutHandle,
    RolloutProtocolError,
)
from rollout_sdk.client.traingate import (
    ATTEMPT_EXTENSION,
    CallObserver,
    CompletionsResult,
    HttpClientShards,
    OsmosisLLMClient,
    new_http_client,
    observe_traingate_calls,
)

__all__ = [
    "ATTEMPT_EXTENSION",
    "CallObserver",
    "CompletionsResult",
    "HttpClientShards",
    "OsmosisLLMClient",
    "RolloutAdmissionTimeoutError",
    "RolloutClient",
    "RolloutHandle",
    "RolloutProtocolError",
    "new_http_client",
    "observe_traingate_calls",
]
