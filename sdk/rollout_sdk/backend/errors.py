"""Mapping exceptions from workflows and graders onto the wire's error categories (P§2.6)."""

from __future__ import annotations

from rollout_sdk.types.sample import RolloutErrorCategory

_SANDBOX_PROVIDER_ERRORS = frozenset(
    {
        "SandboxConnectionException",
        "SandboxRateLimitException",
        "PoolStateStoreUnavailableException",
    }
)
_SANDBOX_API_ERRORS = frozenset({"SandboxApiException", "SandboxAPIError"})
_PROVIDER_STATUSES = frozenset({401, 402, 403, 429, 500, 502, 503, 504})


def _is_provider_failure(exc: BaseException) -> bool:
    status = getattr(exc, "status_code", None)
    for cls in type(exc).__mro__:
        if cls.__name__ in _SANDBOX_PROVIDER_ERRORS:
            return True
        if cls.__name__ in _SANDBOX_API_ERRORS and status in _PROVIDER_STATUSES:
            return True
    return False


def categorize_exception(exc: BaseException) -> RolloutErrorCategory:
    if isinstance(exc, TimeoutError):
        return RolloutErrorCategory.TIMEOUT
    if isinstance(exc, ValueError | TypeError | AssertionError):
        return RolloutErrorCategory.VALIDATION_ERROR
    if _is_provider_failure(exc):
        return RolloutErrorCategory.HTTP_ERROR
    return RolloutErrorCategory.AGENT_ERROR


__all__ = ["categorize_exception"]
