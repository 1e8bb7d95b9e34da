"""How ``rollout-fleet`` shows records on a terminal: as data (never markup, control characters
escaped), and ``ls``'s rollout ids whole at any width, since an id cut short cannot be pasted
into ``status`` or ``cancel``. Imported only by the commands that print tables: rich is not
free to import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from rollout_sdk.terminal import as_data as shown

if TYPE_CHECKING:
    from rollout_core.views import RolloutView

GAP = 2  # columns between two columns (padding, collapsed, and the box's blank divider)
FOLDED_MIN = 10  # narrower than this, a folded column is more noise than help


def _clipped(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[RolloutView], str]


# Always shown, each as wide as its widest cell (they are short).
_FIXED = (
    _Column("proto", lambda view: view.protocol),
    _Column("status", lambda view: view.status),
    _Column("try", lambda view: str(view.attempt)),
    _Column("age s", lambda view: f"{view.age_seconds:.1f}"),
    _Column("run s", lambda view: "" if view.run_seconds is None else f"{view.run_seconds:.2f}"),
)
# Shown in the width left over, folded, in this order; when there is not room for both, the
# error is kept.
_WORKER = _Column("worker", lambda view: view.worker or "")
_ERROR = _Column("error", lambda view: _clipped(view.error or "", 60))


def _width(column: _Column, views: list[RolloutView]) -> int:
    return max([len(column.header), *(len(shown(column.cell(view))) for view in views)])


def views_table(views: list[RolloutView], width: int) -> tuple[RenderableType, list[str]]:
    """``ls``'s listing for a terminal ``width`` columns wide, and the headers of the columns
    left out for want of room. Ids come first, whole, on one line each: in a table when they
    fit beside the short columns (the error and the worker then take the width left, folded,
    or are left out); else each rollout on lines of its own, its id first."""
    ids = [shown(view.rollout_id) for view in views]
    fixed = [(column, _width(column, views)) for column in _FIXED]
    id_width = max([len("rollout"), *(len(text) for text in ids)])
    room = width - id_width - sum(wide + GAP for _, wide in fixed)
    if room < 0:
        return _stacked(views, ids), []
    folded: dict[str, int] = {}
    for column in (_ERROR, _WORKER):  # the error first: it says why a rollout failed
        wanted, fits = _width(column, views), room - GAP
        if fits >= min(wanted, FOLDED_MIN):
            folded[column.header] = min(wanted, fits)
            room -= folded[column.header] + GAP
    shown_folded = [(c, folded[c.header]) for c in (_WORKER, _ERROR) if c.header in folded]
    left_out = [c.header for c in (_WORKER, _ERROR) if c.header not in folded]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column("rollout", width=id_width, no_wrap=True)
    for column, wide in fixed:
        table.add_column(column.header, width=wide, no_wrap=True)
    for column, wide in shown_folded:
        table.add_column(column.header, width=wide, overflow="fold")
    for view, rollout_id in zip(views, ids, strict=True):
        table.add_row(
            rollout_id,
            *(shown(column.cell(view)) for column, _ in fixed),
            *(shown(column.cell(view)) for column, _ in shown_folded),
        )
    return table, left_out


def _stacked(views: list[RolloutView], ids: list[Text]) -> RenderableType:
    """Each rollout on lines of its own: its id (folded only if wider than the terminal),
    then, indented, the other columns in words."""
    lines: list[RenderableType] = []
    for view, rollout_id in zip(views, ids, strict=True):
        lines.append(Text.assemble(rollout_id, style="bold"))
        words = [f"{view.protocol} {view.status}, try {view.attempt}"]
        words.append(f"age {view.age_seconds:.1f} s")
        if view.run_seconds is not None:
            words.append(f"run {view.run_seconds:.2f} s")
        if view.worker:
            words.append(f"worker {view.worker}")
        if view.error:
            words.append(f"error: {_ERROR.cell(view)}")
        lines.append(Padding(shown(", ".join(words)), (0, 0, 0, 4)))
    return Group(*lines)


__all__ = ["views_table"]
