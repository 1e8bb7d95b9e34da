"""Dataset rows for local runs (``rollout-sdk test``): JSONL, Parquet or CSV files whose rows
carry ``system_prompt``, ``user_prompt`` and ``ground_truth`` (SDK.md §1.15, §2.15).

Column names match case-insensitively. v1 rows need all three as non-empty strings; v2 rows
need a ``user_prompt`` (or a ``metadata`` column), and take ``label`` for ``ground_truth``.
Every other column rides along in the row's ``extra`` (v1: request metadata).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_sdk.core.schemas import MessageDict

SUFFIXES = (".jsonl", ".parquet", ".csv")
V1_COLUMNS = ("system_prompt", "user_prompt", "ground_truth")


class DatasetError(Exception):
    """The dataset cannot be read, or a row lacks what a rollout needs."""


@dataclass(frozen=True)
class DatasetRow:
    index: int
    system_prompt: str | None
    user_prompt: str | None
    ground_truth: str | None
    metadata: dict[str, Any] | None = None  # v2: the row's own metadata column
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> list[MessageDict]:
        messages: list[MessageDict] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        if self.user_prompt:
            messages.append({"role": "user", "content": self.user_prompt})
        return messages


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: a row must be a JSON object")
            yield row


def _parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError(
            "reading Parquet needs pyarrow: pip install 'rollout-sdk[parquet]'"
        ) from exc
    try:
        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DatasetError(f"{path}: cannot read Parquet ({exc})") from exc
    yield from rows


def _csv(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8", newline="") as rows:
        yield from csv.DictReader(rows)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of a ``.jsonl``, ``.parquet`` or ``.csv`` file, keys lower-cased."""
    if not path.is_file():
        raise DatasetError(f"dataset {str(path)!r} does not exist")
    readers = {".jsonl": _jsonl, ".parquet": _parquet, ".csv": _csv}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise DatasetError(f"dataset {path.name!r}: use one of {', '.join(SUFFIXES)}")
    return [{str(key).lower(): value for key, value in row.items()} for row in reader(path)]


def _text(row: dict[str, Any], column: str, index: int, *, required: bool) -> str | None:
    value = row.get(column)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"row {index}: {column!r} must be a non-empty string, got {value!r}")
    return value


def v1_row(row: dict[str, Any], index: int) -> DatasetRow:
    missing = [column for column in V1_COLUMNS if column not in row]
    if missing:
        raise DatasetError(f"row {index}: missing column(s) {', '.join(missing)}")
    return DatasetRow(
        index=index,
        system_prompt=_text(row, "system_prompt", index, required=True),
        user_prompt=_text(row, "user_prompt", index, required=True),
        ground_truth=_text(row, "ground_truth", index, required=True),
        extra={key: value for key, value in row.items() if key not in V1_COLUMNS},
    )


def v2_row(row: dict[str, Any], index: int) -> DatasetRow:
    metadata = row.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise DatasetError(f"row {index}: 'metadata' must be an object, got {metadata!r}")
    label = row.get("ground_truth", row.get("label"))
    return DatasetRow(
        index=index,
        system_prompt=_text(row, "system_prompt", index, required=False),
        user_prompt=_text(row, "user_prompt", index, required=metadata is None),
        ground_truth=None if label is None else str(label),
        metadata=metadata,
        extra={
            key: value
            for key, value in row.items()
            if key not in (*V1_COLUMNS, "label", "metadata")
        },
    )


__all__ = ["SUFFIXES", "DatasetError", "DatasetRow", "read_rows", "v1_row", "v2_row"]
