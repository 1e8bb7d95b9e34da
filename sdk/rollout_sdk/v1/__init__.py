"""The v1 (push/callback) SDK under names that cannot be mistaken for v2's: the agent loop,
its context and result, the wire models, the TrainGate client, the in-process server.

``rollout_sdk`` itself keeps the upstream ``osmosis_ai.rollout`` names, where
``RolloutContext`` and ``RolloutStatus`` are these v1 ones; ``rollout_sdk.v2`` has the v2
ones. The names are listed once, in ``__init__.pyi``.
"""

from rollout_sdk._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
