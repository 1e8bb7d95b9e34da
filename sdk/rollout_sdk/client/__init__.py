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
from rollout_sdk.client.turns import Turn, TurnRecorder, recording_turns

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
    "Turn",
    "TurnRecorder",
    "new_http_client",
    "observe_traingate_calls",
    "recording_turns",
]
