"""A clear error when an integration's framework is not installed."""

from __future__ import annotations

from typing import NoReturn


def missing_extra(exc: ModuleNotFoundError, *, extra: str, feature: str) -> NoReturn:
    raise ModuleNotFoundError(
        f"{feature} needs the '{exc.name}' package: pip install 'rollout-sdk[{extra}]'",
        name=exc.name,
    ) from exc


__all__ = ["missing_extra"]
