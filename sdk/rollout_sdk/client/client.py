"""``osmosis_ai.rollout.client.client``: upstream's module path for the trainer's v2 client,
which lives in :mod:`rollout_sdk.client.trainer`."""

from rollout_sdk.client.trainer import (
    RolloutAdmissionTimeoutError,
    RolloutClient,
    RolloutHandle,
    RolloutProtocolError,
)

__all__ = [
    "RolloutAdmissionTimeoutError",
    "RolloutClient",
    "RolloutHandle",
    "RolloutProtocolError",
]
