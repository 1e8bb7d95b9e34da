"""What a rubric judgement returns, and the errors a judge call raises (upstream's
``osmosis_ai.eval.rubric.types``: the same classes, bases and messages, so user code that
catches them keeps working)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RubricResult:
    """One judgement: the score (already clamped into the requested range) and the judge's
    reason for it."""

    score: float
    explanation: str


class MissingAPIKeyError(RuntimeError):
    """No key for the judge's provider: neither passed nor in its environment variable."""


class ProviderRequestError(RuntimeError):
    """The judge's provider failed the call, or answered something that is not a judgement.

    ``provider``, ``model`` and ``detail`` are kept so a caller can report them apart.
    """

    def __init__(self, provider: str, model: str, detail: str) -> None:
        self.provider = provider
        self.model = model
        self.detail: str = (
            detail.strip() if detail else "Provider request failed with no additional detail."
        )
        super().__init__(f"Provider '{provider}' request for model '{model}' failed. {self.detail}")


class ModelNotFoundError(ProviderRequestError):
    """The provider does not know the judge model (HTTP 404)."""


__all__ = ["MissingAPIKeyError", "ModelNotFoundError", "ProviderRequestError", "RubricResult"]
