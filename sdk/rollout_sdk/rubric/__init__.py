"""Rubric scoring by an LLM judge (upstream's ``osmosis_ai.eval.rubric``; the alias maps
``osmosis_ai.eval`` and ``osmosis_ai.eval.rubric`` here). ``evaluate_rubric`` is also on the
top level, as upstream's ``osmosis_ai.evaluate_rubric``."""

from rollout_sdk.rubric.engine import evaluate_rubric
from rollout_sdk.rubric.types import (
    MissingAPIKeyError,
    ModelNotFoundError,
    ProviderRequestError,
    RubricResult,
)

__all__ = [
    "MissingAPIKeyError",
    "ModelNotFoundError",
    "ProviderRequestError",
    "RubricResult",
    "evaluate_rubric",
]
