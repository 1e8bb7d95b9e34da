"""``@osmosis_reward``: the reward-function decorator (SDK.md §1.13).

A *classic* reward function (first parameter ``solution_str``) has its signature checked
when it is decorated and its return type checked on every call, so a mistake surfaces at
import time instead of as a silently wrong reward in training.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union, cast

F = TypeVar("F", bound=Callable[..., Any])

_CLASSIC_FIRST_PARAM = "solution_str"


def _is_str(annotation: Any) -> bool:
    return annotation is str or annotation == "str"


def _is_dictish(annotation: Any) -> bool:
    """``dict``, ``dict[...]``, ``Mapping``-free ``dict | None`` or ``Optional[dict]``."""
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        return text.startswith(("dict", "Dict", "Optional[dict", "Optional[Dict")) and (
            text.endswith(("]", "dict", "Dict", "|None"))
        )
    if annotation is dict or typing.get_origin(annotation) is dict:
        return True
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return len(members) == 1 and _is_dictish(members[0])
    return False


def _resolved_hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except Exception:
        return dict(getattr(func, "__annotations__", {}))


def _check_classic_signature(func: Callable[..., Any]) -> None:
    params = list(inspect.signature(func).parameters.values())
    name = getattr(func, "__qualname__", repr(func))
    positional = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(positional) < 3:
        raise TypeError(
            f"{name}: a reward function must take (solution_str: str, ground_truth: str, "
            "extra_info: dict = None, **kwargs)"
        )
    hints = _resolved_hints(func)
    solution, truth, extra = positional[:3]
    for param, check, expected in (
        (solution, _is_str, "str"),
        (truth, _is_str, "str"),
        (extra, _is_dictish, "dict"),
    ):
        if param.name not in hints:
            raise TypeError(f"{name}: parameter '{param.name}' must be annotated as {expected}")
        if not check(hints[param.name]):
            raise TypeError(
                f"{name}: parameter '{param.name}' must be annotated as {expected}, "
                f"got {hints[param.name]!r}"
            )
    if extra.default is inspect.Parameter.empty:
        raise TypeError(f"{name}: parameter '{extra.name}' needs a default (usually None)")


def _accepts_data_source(func: Callable[..., Any]) -> bool:
    params = inspect.signature(func).parameters.values()
    return any(p.name == "data_source" or p.kind is p.VAR_KEYWORD for p in params)


def _check_float(func: Callable[..., Any], result: Any) -> float:
    if not isinstance(result, float):
        raise TypeError(
            f"{getattr(func, '__qualname__', func)} must return a float, "
            f"got {type(result).__name__}"
        )
    return result


def osmosis_reward(func: F) -> F:
    """Wrap a (sync or async) reward function, validating classic signatures."""
    params = list(inspect.signature(func).parameters)
    classic = bool(params) and params[0] == _CLASSIC_FIRST_PARAM
    if classic:
        _check_classic_signature(func)
    drop_data_source = not _accepts_data_source(func)

    def prepare(kwargs: dict[str, Any]) -> dict[str, Any]:
        if drop_data_source:
            kwargs.pop("data_source", None)
        return kwargs

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            result = await func(*args, **prepare(kwargs))
            return _check_float(func, result) if classic else result

        return cast(F, async_wrapper)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **prepare(kwargs))
        return _check_float(func, result) if classic else result

    return cast(F, wrapper)


__all__ = ["osmosis_reward"]
