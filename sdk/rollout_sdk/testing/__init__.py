"""Testing helpers: the mock TrainGate and its responders (needs ``rollout-sdk[server]``)."""

from rollout_sdk.testing.mock_trainer import (
    Fault,
    MockTrainGate,
    RolloutCompletionTracker,
    create_mock_trainer_app,
    fake_prompt_token_ids,
    fake_token_ids,
    patch_httpx_for_mock_trainer,
)
from rollout_sdk.testing.responders import (
    RESPONDERS,
    AssistantTurn,
    Responder,
    calculator_responder,
    keyword_responder,
)

__all__ = [
    "RESPONDERS",
    "AssistantTurn",
    "Fault",
    "MockTrainGate",
    "Responder",
    "RolloutCompletionTracker",
    "calculator_responder",
    "create_mock_trainer_app",
    "fake_prompt_token_ids",
    "fake_token_ids",
    "keyword_responder",
    "patch_httpx_for_mock_trainer",
]
