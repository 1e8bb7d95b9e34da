"""Exceptions raised by the SDK (SDK.md §1.8).

The ``Osmosis*`` names are the upstream ones, kept so agent code that catches them
runs unchanged; each carries enough context to say what failed without a traceback.
"""

from __future__ import annotations


class OsmosisRolloutError(Exception):
    """Base class of every error the SDK raises into agent code."""


class OsmosisTransportError(OsmosisRolloutError):
    """The TrainGate could not be reached (connection refused, DNS, reset). Retryable."""


class RefusedDestinationError(OsmosisTransportError):
    """The TrainGate's address is one the SDK never connects to (link-local, cloud metadata,
    a refused network): not retried, it will not change."""


class OsmosisServerError(OsmosisRolloutError):
    """The TrainGate answered with a 5xx status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class OsmosisValidationError(OsmosisRolloutError):
    """The TrainGate rejected the call (4xx) or answered with an unexpected status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class OsmosisTimeoutError(OsmosisRolloutError):
    """A TrainGate call exceeded the client timeout."""


class AgentLoopNotFoundError(OsmosisRolloutError):
    """No agent loop is registered under the requested name."""

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f"Agent loop '{name}' not found. Available: {available}")
        self.name = name
        self.available = available


class ToolExecutionError(OsmosisRolloutError):
    """A tool call could not be executed."""

    def __init__(self, message: str, tool_call_id: str = "", tool_name: str = "") -> None:
        super().__init__(message)
        self.tool_call_id = tool_call_id
        self.tool_name = tool_name


class ToolArgumentError(ToolExecutionError):
    """A tool call's arguments could not be parsed into a JSON object."""


__all__ = [
    "AgentLoopNotFoundError",
    "OsmosisRolloutError",
    "OsmosisServerError",
    "OsmosisTimeoutError",
    "OsmosisTransportError",
    "OsmosisValidationError",
    "RefusedDestinationError",
    "ToolArgumentError",
    "ToolExecutionError",
]
