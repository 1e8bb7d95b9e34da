"""Showing text that came from elsewhere — a dataset row, a model's answer, an endpoint's
error, an admitted id — on an operator's terminal.

Such text is data: never read as Rich markup (``[/]`` would end a run with a traceback,
``[link=…]`` would render a hyperlink) and never obeyed by the terminal (an ``ESC`` sequence
could retitle the window or rewrite what is shown). Every table cell and line of such text
goes through :func:`as_data`.
"""

from __future__ import annotations

from rich.text import Text


def as_data(value: object) -> Text:
    """``value`` as plain text, its control characters written as escapes (``\\x1b``)."""
    text = "" if value is None else str(value)
    return Text(
        "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    )


__all__ = ["as_data"]
