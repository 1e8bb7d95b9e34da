"""The v2 (poll/lease) SDK under names that cannot be mistaken for v1's: the workflow and
grader, their contexts, the ambient ``RolloutContext`` and the v2 ``RolloutStatus``, configs,
samples, the wire models, backends, the in-process server and the trainer's client.

``rollout_sdk`` itself keeps the upstream ``osmosis_ai.rollout`` names, where
``RolloutContext`` and ``RolloutStatus`` are the v1 ones. The names are listed once, in
``__init__.pyi``.
"""

from rollout_sdk._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
