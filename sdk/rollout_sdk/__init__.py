"""Rollout SDK: write an agent once, run it on Rollout Fleet (Osmosis remote-rollout compatible).

The top level has the upstream ``osmosis_ai.rollout`` names (``RolloutContext`` and
``RolloutStatus`` are v1's, as upstream's 0.2 docs import them); ``rollout_sdk.v1`` and
``rollout_sdk.v2`` hold each generation's names unambiguously. Every public name is listed
once, in ``__init__.pyi``, and resolved lazily, so ``import rollout_sdk`` (or the
``osmosis_ai`` alias) stays cheap and never imports FastAPI.
"""

from rollout_sdk._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
