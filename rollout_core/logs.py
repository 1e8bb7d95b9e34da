"""Log lines of the fleet's processes: text or JSON (``ROLLOUT_FLEET_LOG_FORMAT``), each naming
the rollout it is about (``rollout_id``) when there is one.

Code working on a rollout runs inside :func:`about`; a request log line (uvicorn's access log)
names the rollout in its path. :func:`log_config` is one ``logging.config.dictConfig``
for every process: the gateway hands it to uvicorn (so each of its worker processes applies
it), a worker applies it when Celery asks (``setup_logging``). Its handler shows ``***`` for
the keys of the rollouts the process holds (``secrets.hiding``).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from contextvars import ContextVar, Token
from typing import Any, Literal

from rollout_core.secrets import HiddenSecretsFilter
from rollout_sdk.core.foreign import describe, format_exception, scrub

LogFormat = Literal["text", "json"]

_rollout: ContextVar[str | None] = ContextVar("rollout_id", default=None)
# Routes that carry a rollout id: /rollout/<id>/result, /v1/rollouts/<id>
_ID_IN_PATH = re.compile(r"/rollouts?/(?P<id>[^/\s?\"]+)(?:/result)?(?:[?\s\"]|$)")
_NOT_IDS = {"cancel", "init"}  # /rollout/cancel, /v1/rollout/init
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(rollout)s: %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s %(rollout_id)s"


@contextlib.contextmanager
def about(rollout_id: str) -> Iterator[None]:
    """Every line logged in this block (this task or thread) names ``rollout_id``."""
    token = begin(rollout_id)
    try:
        yield
    finally:
        end(token)


def begin(rollout_id: str) -> Token[str | None]:
    """Lines logged from here on (this task or thread) name ``rollout_id``, until :func:`end`."""
    return _rollout.set(rollout_id)


def end(token: Token[str | None]) -> None:
    _rollout.reset(token)


class ForeignBytesFilter(logging.Filter):
    """A record never shows bytes another service sent (``rollout_sdk.core.foreign``): an
    exception among its arguments is shown as :func:`describe` tells it, its traceback as
    :func:`format_exception` prints it, and its message loses any foreign exception's text it
    quotes. On a handler, before :class:`HiddenSecretsFilter`, so it sees every logger's
    lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, BaseException):
            record.msg = describe(record.msg)
        if isinstance(record.args, tuple) and any(
            isinstance(arg, BaseException) for arg in record.args
        ):
            record.args = tuple(
                describe(arg) if isinstance(arg, BaseException) else arg for arg in record.args
            )
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            message = record.getMessage()
            shown = scrub(message, error)
            if shown != message:
                record.msg, record.args = shown, None
            record.exc_text = format_exception(error).rstrip("\n")
            record.exc_info = None
        return True


class RolloutIdFilter(logging.Filter):
    """Adds ``rollout_id`` (and ``rollout``, its text form) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        rollout_id = getattr(record, "rollout_id", None) or _rollout.get()
        if rollout_id is None and record.name == "uvicorn.access":
            match = _ID_IN_PATH.search(record.getMessage())
            rollout_id = match["id"] if match and match["id"] not in _NOT_IDS else None
        record.rollout_id = rollout_id
        record.rollout = f" [{rollout_id}]" if rollout_id else ""
        return True


# C0 and C1 controls, DEL and the Unicode line breaks: text a rollout id or an agent's
# message may carry that would end a line or move a terminal's cursor.
_CONTROLS = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
}


class TextFormatter(logging.Formatter):
    """The text format, one line per record whatever its message and rollout id hold: their
    control characters are shown escaped (``\\x0a``), so an admitted id cannot forge a line or
    drive the reader's terminal. A traceback still follows on its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        shown = logging.makeLogRecord(record.__dict__)
        shown.message = record.message.translate(_CONTROLS)
        shown.rollout = str(getattr(record, "rollout", "")).translate(_CONTROLS)
        return super().formatMessage(shown)


def log_config(level: str, log_format: LogFormat) -> dict[str, Any]:
    """One configuration for the root logger and uvicorn's; httpx's line per request only
    at debug (a line per LLM call is noise, and CPU, at fleet rates)."""
    formatter: dict[str, Any] = (
        {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": JSON_FIELDS,
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        }
        if log_format == "json"
        else {"()": TextFormatter, "format": TEXT_FORMAT}
    )
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "rollout_id": {"()": RolloutIdFilter},
            "foreign_bytes": {"()": ForeignBytesFilter},
            "hidden_secrets": {"()": HiddenSecretsFilter},
        },
        "formatters": {"fleet": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "fleet",
                "filters": ["rollout_id", "foreign_bytes", "hidden_secrets"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            "uvicorn": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": level, "propagate": True},
            "httpx": {"level": "DEBUG" if level == "DEBUG" else "WARNING"},
        },
    }


def configure(level: str, log_format: LogFormat) -> None:
    import logging.config

    logging.config.dictConfig(log_config(level, log_format))


__all__ = [
    "ForeignBytesFilter",
    "LogFormat",
    "RolloutIdFilter",
    "TextFormatter",
    "about",
    "begin",
    "configure",
    "end",
    "log_config",
]
