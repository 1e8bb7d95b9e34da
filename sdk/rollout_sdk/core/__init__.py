"""Protocol core (``osmosis_ai.rollout.core``): the agent-loop base classes, wire schemas and
exceptions. The names are listed once, in ``__init__.pyi``, and resolved lazily, so importing
one core module does not import the others."""

from rollout_sdk._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
