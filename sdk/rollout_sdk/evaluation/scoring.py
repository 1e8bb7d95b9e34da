"""v1-era eval functions (``--eval-fn module:function``), in either signature style.

The first parameter's name says which (SDK.md §1.15): ``solution_str`` — the function gets
the last assistant message's text, ``ground_truth`` and ``extra_info`` (the row's metadata);
``messages`` — it gets the whole conversation, ``ground_truth`` and ``metadata``. Any other
first parameter is refused when the function is loaded, not when the first row is scored.
A function may be sync (run in a thread: it may block) or async, and returns a number.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from rollout_sdk.core.schemas import MessageDict
from rollout_sdk.loader import AgentLoadError, import_agent_module, split_reference

Style = Literal["solution_str", "messages"]


class EvalFnError(Exception):
    """An eval function cannot be loaded, or did not return a number."""


def last_assistant_text(messages: Sequence[MessageDict]) -> str:
    """The text of the conversation's last assistant message ("" if there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant" and message.get("content") is not None:
            return str(message.get("content"))
    return ""


@dataclass(frozen=True)
class EvalFn:
    """A loaded eval function; ``name`` is its reference, the key of its scores."""

    name: str
    function: Callable[..., Any]
    style: Style

    async def score(
        self, messages: Sequence[MessageDict], ground_truth: str | None, metadata: dict[str, Any]
    ) -> float:
        kwargs: dict[str, Any]
        if self.style == "solution_str":
            kwargs = {
                "solution_str": last_assistant_text(messages),
                "ground_truth": ground_truth,
                "extra_info": metadata,
            }
        else:
            kwargs = {
                "messages": list(messages),
                "ground_truth": ground_truth,
                "metadata": metadata,
            }
        if inspect.iscoroutinefunction(self.function):
            value = await self.function(**kwargs)
        else:
            value = await asyncio.to_thread(self.function, **kwargs)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EvalFnError(
                f"eval function {self.name!r} returned {type(value).__name__}, expected a number"
            )
        return float(value)


def _style(function: Callable[..., Any], name: str) -> Style:
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError) as exc:
        raise EvalFnError(f"cannot inspect eval function {name!r}: {exc}") from exc
    first = parameters[0] if parameters else None
    for style in get_args(Style):
        if first == style:
            return cast(Style, style)
    raise EvalFnError(
        f"eval function {name!r}: its first parameter is {first!r}; expected 'solution_str' "
        "(gets the last assistant text) or 'messages' (gets the whole conversation)"
    )


def load_eval_fns(references: Sequence[str]) -> list[EvalFn]:
    """Each ``module:function`` (or ``file.py:function``) loaded and its style checked."""
    loaded: list[EvalFn] = []
    for reference in references:
        if reference in (fn.name for fn in loaded):
            raise EvalFnError(f"eval function {reference!r} is given twice")
        try:
            target, attribute = split_reference(reference)
            if attribute is None:
                raise EvalFnError(f"eval function {reference!r}: expected module:function")
            function = getattr(import_agent_module(target), attribute, None)
        except AgentLoadError as exc:
            raise EvalFnError(str(exc)) from exc
        if not callable(function):
            raise EvalFnError(f"eval function {reference!r} is missing or not callable")
        loaded.append(EvalFn(reference, function, _style(function, reference)))
    return loaded


__all__ = ["EvalFn", "EvalFnError", "last_assistant_text", "load_eval_fns"]
