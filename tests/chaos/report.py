"""Print the chaos suite's figures (``test-output/chaos/*.json``, written by the last run) as
the Markdown table in docs/RELIABILITY.md: ``uv run python -m tests.chaos.report``."""

from __future__ import annotations

import json
from typing import Any

from tests.chaos.harness import FIGURES

COMMON = (
    "scenario",
    "protocol",
    "offered",
    "admitted",
    "completed",
    "failed",
    "duplicates",
    "contradictions",
    "lost",
    "reruns",
    "statuses",
)


def _details(figures: dict[str, Any]) -> str:
    return ", ".join(f"{key}: {value}" for key, value in figures.items() if key not in COMMON)


def table() -> str:
    rows = [json.loads(path.read_text()) for path in sorted(FIGURES.glob("*.json"))]
    lines = [
        "| scenario | protocol | offered | admitted | completed | failed (clear error) "
        "| duplicated | contradicted | lost | rerun after a lost worker | scenario figures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row.get(key, "") for key in COMMON[:-1]]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + f" | {_details(row)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
