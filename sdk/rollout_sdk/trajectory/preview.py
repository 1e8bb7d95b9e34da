"""Live trajectory previews: ``<_OSMOSIS_ROLLOUT_PREVIEW_ROOT>/<rollout_id>/preview.json``.

Upstream's rollout servers (0.3.6 on) let the Osmosis platform show a rollout while it runs:
with the platform-reserved ``_OSMOSIS_ROLLOUT_PREVIEW_ROOT`` set, the server rewrites one
small ATIF document per rollout as the conversation grows and as its status changes, ending
with the final status. Our in-process server (``create_rollout_server``) does the same.

The conversation comes from the rollout's sample source (``SampleSource.get_preview``, at
most :data:`MAX_PREVIEW_MESSAGES` recent messages), asked at every status change and every
:data:`PREVIEW_INTERVAL_SEC` seconds. A preview is for people watching, not for training:
it keeps only the newest messages, clips long texts, drops token ids and logprobs, and
replaces the rollout's API key and anything shaped like a credential with ``[REDACTED]``.
Writes are atomic (readers never see half a file) and best effort: nothing here changes a
rollout's result. A workflow that sets ``ctx.preview_enabled = False`` on its rollout
context gets no further snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rollout_sdk.context import RolloutContext, RolloutProgress
from rollout_sdk.trajectory.atif import Trajectory
from rollout_sdk.trajectory.converter import convert_sample_to_trajectory
from rollout_sdk.types.sample import RolloutSample

logger = logging.getLogger(__name__)

PREVIEW_ROOT_ENV = "_OSMOSIS_ROLLOUT_PREVIEW_ROOT"
PREVIEW_FILE = "preview.json"
PREVIEW_INTERVAL_SEC = 3.0
SOURCE_TIMEOUT_SEC = 1.0
MAX_PREVIEW_MESSAGES = 100
MAX_PREVIEW_BYTES = 900 * 1024
MAX_TEXT_CHARS = 16_384
MAX_ITEMS = 1000
MAX_DEPTH = 20
REDACTED = "[REDACTED]"
CLIPPED = " [preview truncated]"
TOO_LARGE = "This turn exceeds the live preview size limit."

# Ids that are one safe path segment (upstream's rule for preview directories).
_ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}\Z")
_DROPPED_KEYS = frozenset({"prompt_token_ids", "completion_token_ids", "logprobs"})
_STEP_KEYS = frozenset(
    {
        "timestamp",
        "source",
        "model_name",
        "message",
        "reasoning_content",
        "reasoning_effort",
        "llm_call_count",
        "is_copied_context",
        "tool_calls",
        "observation",
    }
)
# Credentials inside text: "Bearer <token>", "api_key=<value>" / "password: <value>", and
# the user:password part of URLs. Keys of mappings naming a credential are blanked whole.
_AUTH_HEADER = re.compile(r"(?i)\b(Bearer|Basic)\s+[^\s\"',;]+")
_ASSIGNMENT = re.compile(
    r"(?i)\b([\w-]*(?:api[_-]?key|authorization|password|passwd|credential|secret|token)"
    r"[\w-]*\s*[=:]\s*)((?:Bearer|Basic)\s+\[REDACTED\]|\"[^\"\n]*\"|'[^'\n]*'|[^\s,;\]}]+)"
)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@]+:[^\s/@]+@")
_CREDENTIAL_KEY = re.compile(
    r"(?i)(api[_-]?key|authorization|password|passwd|secret|credential|access[_-]?key"
    r"|private[_-]?key|(?:^|[_-])token$)"
)


def preview_root(rollout_id: str) -> Path | None:
    """The preview root when previews are on for this rollout: the variable is set, the
    rollout id is one safe path segment, and the root is absolute with no symlink on its
    path (one warning line otherwise)."""
    configured = os.environ.get(PREVIEW_ROOT_ENV)
    if not configured or not _ROLLOUT_ID.fullmatch(rollout_id):
        return None
    root = Path(configured)
    if not root.is_absolute() or any(path.is_symlink() for path in (root, *root.parents)):
        logger.warning(
            "%s must be an absolute directory without symlinks; live previews are off",
            PREVIEW_ROOT_ENV,
        )
        return None
    return root


class _Scrubber:
    """Redacts credentials and clips sizes; remembers whether it clipped anything."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self.truncated = False

    def text(self, value: str) -> str:
        if self.api_key:
            value = value.replace(self.api_key, REDACTED)
        value = _AUTH_HEADER.sub(lambda match: f"{match[1]} {REDACTED}", value)
        value = _ASSIGNMENT.sub(lambda match: match[1] + REDACTED, value)
        value = _URL_USERINFO.sub(lambda match: f"{match[1]}{REDACTED}@", value)
        if len(value) > MAX_TEXT_CHARS:
            self.truncated = True
            value = value[:MAX_TEXT_CHARS] + CLIPPED
        return value

    def value(self, value: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            self.truncated = True
            return CLIPPED.strip()
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            if len(value) > MAX_ITEMS:
                self.truncated = True
            return {
                self.text(str(key)): REDACTED
                if _CREDENTIAL_KEY.search(str(key))
                else self.value(child, depth + 1)
                for key, child in list(value.items())[:MAX_ITEMS]
                if key not in _DROPPED_KEYS
            }
        if isinstance(value, list | tuple):
            if len(value) > MAX_ITEMS:
                self.truncated = True
            return [self.value(child, depth + 1) for child in value[:MAX_ITEMS]]
        return value


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def _step(original: dict[str, Any], index: int) -> dict[str, Any]:
    """A step renumbered from ``index`` with what a viewer shows: no metrics, no extras."""
    step = {key: value for key, value in original.items() if key in _STEP_KEYS}
    step["step_id"] = index
    calls = [
        {key: call[key] for key in ("tool_call_id", "function_name", "arguments") if key in call}
        for call in step.pop("tool_calls", None) or ()
    ]
    if calls:
        step["tool_calls"] = calls
    observation = step.pop("observation", None)
    if observation:
        step["observation"] = {
            "results": [
                {key: result[key] for key in ("source_call_id", "content") if key in result}
                for result in observation.get("results", ())
            ]
        }
    return step


def preview_document(
    sample: RolloutSample, rollout_id: str, api_key: str | None
) -> dict[str, Any] | None:
    """The preview of a sample source's snapshot (without status and version), or ``None``
    when it has no conversation yet."""
    if not sample.trajectory_messages:
        return None
    full = convert_sample_to_trajectory(sample, rollout_id=rollout_id).to_json_dict()
    reported = sample.extra_fields.get("_preview_truncated")
    scrub = _Scrubber(api_key)
    scrub.truncated = (
        bool(reported) if reported is not None else len(sample.messages) >= MAX_PREVIEW_MESSAGES
    )
    steps = full["steps"]
    if len(steps) > MAX_PREVIEW_MESSAGES:
        scrub.truncated = True
        steps = steps[-MAX_PREVIEW_MESSAGES:]
    agent = {k: v for k, v in full["agent"].items() if k in {"name", "version", "model_name"}}
    kept = [_step(step, index) for index, step in enumerate(scrub.value(steps), start=1)]
    turn = sample.extra_fields.get("_preview_turn")
    document: dict[str, Any] = {
        "schema_version": full["schema_version"],
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": scrub.value(agent),
        "steps": kept,
    }
    osmosis: dict[str, Any] = {
        "rollout_id": rollout_id,
        "preview": True,
        "turn": turn if type(turn) is int and turn >= 0 else None,
        "truncated": scrub.truncated,
    }
    # Room for the status, version and timestamp added at publication.
    limit = MAX_PREVIEW_BYTES - 256
    if len(_encode({**document, "extra": {"osmosis": osmosis}})) > limit:
        osmosis["truncated"] = True
        size = len(_encode({**document, "steps": [], "extra": {"osmosis": osmosis}}))
        newest: list[dict[str, Any]] = []
        for step in reversed(kept):
            size += len(_encode(step)) + 1
            if size > limit:
                break
            newest.insert(0, step)
        fallback = [{"step_id": 1, "source": "agent", "message": TOO_LARGE}]
        document["steps"] = [_step(step, i) for i, step in enumerate(newest or fallback, 1)]
    document["extra"] = {"osmosis": osmosis}
    return Trajectory.model_validate(document).to_json_dict()


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".preview-", delete=False) as out:
        temporary = Path(out.name)
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


async def _snapshot(ctx: RolloutContext) -> dict[str, Any] | None:
    source = ctx.sample_source
    if source is None or not ctx.preview_enabled:
        return None
    async with asyncio.timeout(SOURCE_TIMEOUT_SEC):
        sample = await source.get_preview(MAX_PREVIEW_MESSAGES)
    if sample is None or not ctx.preview_enabled:
        return None
    return await asyncio.to_thread(preview_document, sample, ctx.rollout_id, ctx.api_key)


async def publish_previews(
    ctx: RolloutContext,
    progress: RolloutProgress,
    root: Path,
    *,
    interval_sec: float = PREVIEW_INTERVAL_SEC,
) -> None:
    """Keep ``<root>/<rollout_id>/preview.json`` current until the rollout's status is
    terminal; each rewrite bumps ``extra.osmosis.preview_version``."""
    destination = root / ctx.rollout_id / PREVIEW_FILE
    latest: dict[str, Any] | None = None
    published = b""
    version = 0
    while True:
        status = progress.status
        try:
            latest = await _snapshot(ctx) or latest
        except Exception as exc:  # a source failing to preview never touches the rollout
            logger.debug("rollout %s: no preview snapshot (%r)", ctx.rollout_id, exc)
        if latest is not None:
            osmosis = {**latest["extra"]["osmosis"], "status": status.value}
            current = _encode({**latest, "extra": {"osmosis": osmosis}})
            if current != published:
                osmosis["preview_version"] = version + 1
                osmosis["updated_at"] = datetime.now(UTC).isoformat()
                try:
                    data = _encode({**latest, "extra": {"osmosis": osmosis}})
                    await asyncio.to_thread(_write_atomically, destination, data)
                except (OSError, ValueError) as exc:
                    logger.warning("rollout %s: preview not written: %s", ctx.rollout_id, exc)
                else:
                    published, version = current, version + 1
        if status.terminal:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_sec):
                await progress.wait_for_change()


__all__ = [
    "MAX_PREVIEW_MESSAGES",
    "PREVIEW_INTERVAL_SEC",
    "PREVIEW_ROOT_ENV",
    "preview_document",
    "preview_root",
    "publish_previews",
]
