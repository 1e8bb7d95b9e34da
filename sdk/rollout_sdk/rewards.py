"""``@osmosis_reward`` and ``@osmosis_rubric``: the reward- and rubric-function decorators
(SDK.md §1.13).

A *classic* function (first parameter ``solution_str``) has its signature checked when it is
decorated and its return type checked on every call, so a mistake surfaces at import time
instead of as a silently wrong reward in training. Any other signature passes unchecked.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Union, cast

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


def _is_optional_str(annotation: Any) -> bool:
    if _is_str(annotation):
        return True
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        return text in ("str|None", "None|str", "Optional[str]")
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return len(members) == 1 and _is_str(members[0])
    return False


def _check_rubric_signature(func: Callable[..., Any]) -> None:
    params = list(inspect.signature(func).parameters.values())
    name = getattr(func, "__qualname__", repr(func))
    if len(params) < 3:
        raise TypeError(
            f"{name}: a rubric function must take (solution_str: str, ground_truth: str | None, "
            "extra_info: dict)"
        )
    hints = _resolved_hints(func)
    solution, truth, extra = params[:3]
    for param, expected_name, check, expected in (
        (solution, "solution_str", _is_str, "str"),
        (truth, "ground_truth", _is_optional_str, "str or Optional[str]"),
    ):
        if param.name != expected_name:
            raise TypeError(f"{name}: parameter {param.name!r} must be named {expected_name!r}")
        if not check(hints.get(param.name, param.annotation)):
            raise TypeError(
                f"{name}: parameter '{param.name}' must be annotated as {expected}, "
                f"got {hints.get(param.name, param.annotation)!r}"
            )
        if param.default is not inspect.Parameter.empty:
            raise TypeError(f"{name}: parameter '{param.name}' cannot have a default value")
    if extra.name != "extra_info":
        raise TypeError(f"{name}: parameter {extra.name!r} must be named 'extra_info'")


def _rubric_arguments_checker(func: Callable[..., Any]) -> Callable[..., None]:
    """Checks one call's arguments: a ``str`` answer, a ``str``/``None`` reference, and an
    ``extra_info`` (a rubric needs its provider/model/rubric from there)."""
    signature = inspect.signature(func)

    def check(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        for required in ("solution_str", "ground_truth", "extra_info"):
            if required not in bound.arguments:
                raise TypeError(f"'{required}' argument is required")
        solution, truth = bound.arguments["solution_str"], bound.arguments["ground_truth"]
        if not isinstance(solution, str):
            raise TypeError(f"'solution_str' must be a string, got {type(solution).__name__}")
        if truth is not None and not isinstance(truth, str):
            raise TypeError(f"'ground_truth' must be a string or None, got {type(truth).__name__}")

    return check


def _wrap[F: Callable[..., Any]](
    func: F, *, classic: bool, check_arguments: Callable[..., None] | None = None
) -> F:
    """The wrapper both decorators share: drop ``data_source`` when the function cannot take
    it, check a classic function's arguments (rubrics) and float result."""
    drop_data_source = not _accepts_data_source(func)

    def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if drop_data_source:
            kwargs.pop("data_source", None)
        if check_arguments is not None:
            check_arguments(*args, **kwargs)
        return kwargs

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            result = await func(*args, **prepare(args, kwargs))
            return _check_float(func, result) if classic else result

        return cast(F, async_wrapper)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **prepare(args, kwargs))
        return _check_float(func, result) if classic else result

    return cast(F, wrapper)


def _is_classic(func: Callable[..., Any]) -> bool:
    params = list(inspect.signature(func).parameters)
    return bool(params) and params[0] == _CLASSIC_FIRST_PARAM


def osmosis_reward[F: Callable[..., Any]](func: F) -> F:
    """Wrap a (sync or async) reward function, validating classic signatures:
    ``(solution_str: str, ground_truth: str, extra_info: dict = None, **kwargs) -> float``."""
    classic = _is_classic(func)
    if classic:
        _check_classic_signature(func)
    return _wrap(func, classic=classic)


def osmosis_rubric[F: Callable[..., Any]](func: F) -> F:
    """Wrap a (sync or async) rubric function, validating classic signatures:
    ``(solution_str: str, ground_truth: str | None, extra_info: dict) -> float``, where
    ``extra_info`` carries what the rubric needs (typically provider, model and rubric text
    for :func:`rollout_sdk.rubric.evaluate_rubric`). Each call's arguments are checked too."""
    classic = _is_classic(func)
    if not classic:
        return _wrap(func, classic=False)
    _check_rubric_signature(func)
    return _wrap(func, classic=True, check_arguments=_rubric_arguments_checker(func))


__all__ = ["osmosis_reward", "osmosis_rubric"]
