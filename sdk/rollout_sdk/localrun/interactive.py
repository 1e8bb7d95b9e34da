"""``rollout-sdk test --interactive``: step through a row one LLM call at a time.

Before each call the run pauses at a prompt (SDK.md §1.15 commands): ``n``/``next`` sends
this call and pauses before the next, ``c``/``continue`` runs the row to its end,
``m``/``messages`` shows the conversation so far, ``t``/``tools`` the tools offered,
``r N``/``row N`` abandons this row for row N, ``q``/``quit`` stops, ``?``/``help`` lists
these. After a row it shows the outcome and asks which row is next.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from rollout_sdk.core.schemas import MessageDict
from rollout_sdk.localrun.dataset import DatasetRow
from rollout_sdk.localrun.runner import LocalRunner, RowResult

HELP = (
    "n/next: send this call   c/continue: run the row to its end   m/messages: the "
    "conversation   t/tools: the tools   r N/row N: go to row N   q/quit: stop   ?/help"
)
AFTER_ROW_HELP = "n/next: the next row   r N/row N: row N   q/quit: stop"


@dataclass(frozen=True)
class Jump:
    """Where the session goes after this row: another row, or (``row=None``) nowhere."""

    row: int | None


def _show(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


class ConsoleStepper:
    """Pauses each LLM call of the current row at a prompt on the console."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.row_task: asyncio.Task[RowResult] | None = None
        self.jump: Jump | None = None  # set when the user leaves the row mid-way
        self._running_free = False
        self._calls = 0

    def begin_row(self, row: DatasetRow) -> None:
        self._running_free = False
        self._calls = 0
        self.jump = None
        self.console.rule(f"row {row.index}")
        self.console.print(_show(row.messages))

    async def ask(self, prompt: str) -> str:
        try:
            return (await asyncio.to_thread(input, prompt)).strip()
        except EOFError:
            return "q"

    async def before_call(self, rollout_id: str, body: dict[str, Any]) -> bool:
        self._calls += 1
        messages = body.get("messages") or []
        self.console.print(
            f"[bold]call {self._calls}[/bold] of {rollout_id}: {len(messages)} messages, "
            f"{len(body.get('tools') or [])} tools"
        )
        while not self._running_free:
            command, _, argument = (await self.ask("step> ")).partition(" ")
            if command in ("n", "next"):
                return True
            if command in ("c", "continue"):
                self._running_free = True
            elif command in ("m", "messages"):
                self.console.print(_show(messages))
            elif command in ("t", "tools"):
                self.console.print(_show(body.get("tools") or []))
            elif command in ("r", "row") and argument.strip().isdigit():
                return self._leave(Jump(int(argument)))
            elif command in ("q", "quit"):
                return self._leave(Jump(None))
            else:
                self.console.print(HELP)
        return True

    async def after_call(self, rollout_id: str, message: MessageDict | None) -> None:
        self.console.print(f"[bold]answer[/bold] to {rollout_id}:")
        self.console.print(_show(message))

    def _leave(self, jump: Jump) -> bool:
        self.jump = jump
        if self.row_task is not None:
            self.row_task.cancel()
        return False

    async def after_row(self, result: RowResult | None, index: int) -> Jump:
        if result is not None:
            self.console.print(
                f"row {result.row_index}: [bold]{result.status}[/bold], reward {result.reward}"
                + (f", error: {result.error}" if result.error else "")
            )
        while True:
            command, _, argument = (await self.ask("row> ")).partition(" ")
            if command in ("n", "next"):
                return Jump(index + 1)
            if command in ("r", "row") and argument.strip().isdigit():
                return Jump(int(argument))
            if command in ("q", "quit"):
                return Jump(None)
            self.console.print(AFTER_ROW_HELP)


async def step_through(
    runner: LocalRunner, stepper: ConsoleStepper, rows: Sequence[DatasetRow], first: int
) -> list[RowResult]:
    """Run rows one at a time under ``stepper`` from row index ``first``."""
    by_index = {row.index: row for row in rows}
    results: list[RowResult] = []
    jump = Jump(first)
    while jump.row is not None:
        row = by_index.get(jump.row)
        if row is None:
            stepper.console.print(
                f"[red]no row {jump.row}[/red] (rows {min(by_index)}-{max(by_index)})"
            )
            jump = await stepper.after_row(None, jump.row)
            continue
        stepper.begin_row(row)
        task = stepper.row_task = asyncio.create_task(runner.run_row(row))
        await asyncio.wait([task])
        result = None if task.cancelled() else task.result()
        if result is not None:
            results.append(result)
        jump = stepper.jump or await stepper.after_row(result, row.index)
    return results


__all__ = ["ConsoleStepper", "Jump", "step_through"]
