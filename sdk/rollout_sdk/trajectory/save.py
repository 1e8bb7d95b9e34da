"""Archiving a finished rollout: ``<artifact root>/<rollout_id>/trajectory.json`` (ATIF),
and ``diagnostics.json`` beside it when the result carries diagnostics.

The artifact root is the one the rollout's artifacts directory lives under
(``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``, else ``~/.osmosis``). Archiving is best effort: a
failure is logged and never touches the rollout's result.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from rollout_sdk.backend.artifacts import artifact_root as default_artifact_root
from rollout_sdk.trajectory.atif import format_trajectory_json
from rollout_sdk.trajectory.converter import convert_sample_to_trajectory
from rollout_sdk.trajectory.report import SampleReport, TrajectoryReport
from rollout_sdk.types.sample import ExecutionResult

logger = logging.getLogger(__name__)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _report_for_the_sample(
    report: TrajectoryReport | None,
) -> tuple[SampleReport | None, dict[str, SampleReport]]:
    """A rollout has one sample: a report with one entry is its, whatever the key; several
    entries cannot be attributed and are kept aside."""
    if report is None or not report.samples:
        return None, {}
    if len(report.samples) == 1:
        return next(iter(report.samples.values())), {}
    return None, dict(report.samples)


async def save_trajectory(
    *,
    rollout_id: str,
    result: ExecutionResult,
    request_label: str | None = None,
    request_metadata: dict[str, Any] | None = None,
    request_extra_fields: dict[str, Any] | None = None,
    report: TrajectoryReport | None = None,
    artifact_root: Path | None = None,
    diagnostics: dict[str, Any] | None = None,
) -> None:
    """Write the rollout's diagnostics (``diagnostics``, else ``result.extra_fields``) and
    its sample's ATIF document. Never raises; files are written off the event loop."""
    root = artifact_root or default_artifact_root()
    try:
        payload = diagnostics if diagnostics is not None else result.extra_fields
        if payload is not None:
            # Before the checks below, so a failed rollout leaves its diagnostics too.
            text = json.dumps(payload, ensure_ascii=False, indent=2, sort_keys=True, default=str)
            await asyncio.to_thread(_write, root / rollout_id / "diagnostics.json", text.encode())
        sample = result.sample
        if sample is None:
            return
        if sample.trajectory_messages is None:
            logger.info("rollout %s: no trajectory messages, no trajectory saved", rollout_id)
            return
        matched, unmatched = _report_for_the_sample(report)
        if unmatched:
            logger.warning(
                "rollout %s: the trajectory report has %d entries for one sample; they are "
                "kept under extra.osmosis.unmatched_sample_reports",
                rollout_id,
                len(unmatched),
            )
        document = convert_sample_to_trajectory(
            sample,
            rollout_id=rollout_id,
            request_label=request_label,
            request_metadata=request_metadata,
            request_extra_fields=request_extra_fields,
            report=matched,
            default_model_name=report.model_name if report else None,
            unmatched_sample_reports=unmatched or None,
        )
        data = format_trajectory_json(document.to_json_dict()).encode()
        destination = root / rollout_id / "trajectory.json"
        await asyncio.to_thread(_write, destination, data)
        logger.info("rollout %s: trajectory saved to %s", rollout_id, destination)
    except Exception:
        logger.warning("rollout %s: the trajectory could not be saved", rollout_id, exc_info=True)


__all__ = ["save_trajectory"]
