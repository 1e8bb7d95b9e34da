"""Celery task messages, built as the exact string kombu's Redis transport keeps in a queue.

The store's admission and sweeper scripts push these strings themselves, so "record written"
and "job enqueued" happen in one atomic step: no crash can leave a record without its job
or a job without its record. The headers and body come from Celery's own
``app.amqp.as_task_v2``; the wrapping mirrors ``kombu.transport.virtual.Channel``
(``prepare_message`` + ``_inplace_augment_message``). ``tests/test_envelope.py`` pins it
against a message published by ``send_task``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollout_core.store.schema import RecordField

if TYPE_CHECKING:  # the store imports this module, and status/ls/export need no Celery
    from celery import Celery

TASK_NAME = "rollout.run"
# Marks the message an admission pushes to the back of the queue. kombu marks a message it
# pushes again (a restore) as ``redelivered``; every other push of ours goes to the front. The
# lost-message check leans on it: see ``RecordStore.waiting_without_message``.
ADMITTED_HEADER = "rollout_admitted"
REDELIVERED_HEADER = "redelivered"
JSON_CONTENT_TYPE = "application/json"


def new_task_id() -> str:
    """A Celery task id of its own for every message. Never derived from the rollout: a
    worker remembers revoked ids for hours, and a revoke (Flower's button) must not cancel a
    later admission of the same id at once."""
    return str(uuid.uuid4())


def admission_message(
    app: Celery, record_key: str, label: str, queue: str, trace: Mapping[RecordField, str]
) -> tuple[str, dict[RecordField, str]]:
    """An admission's message, and the record field that names it (its task id: what
    Flower's Revoke of this message names)."""
    task_id = new_task_id()
    headers: dict[str, str | bool] = {name: value for name, value in trace.items()}
    headers[ADMITTED_HEADER] = True
    message = task_message(app, record_key, label, queue, headers, task_id=task_id)
    return message, {RecordField.TASK: task_id}


def task_message(
    app: Celery,
    record_key: str,
    label: str,
    queue: str,
    headers: Mapping[str, str | bool] | None = None,
    task_id: str | None = None,
) -> str:
    """The queued form of ``rollout.run(record_key)``; ``label`` is what Flower shows as args.

    The message carries only the record key (the request and its secrets stay in Redis) and
    extra ``headers``: the admission's trace context, and whether an admission pushed it.
    """
    message = app.amqp.as_task_v2(
        task_id or new_task_id(),
        TASK_NAME,
        args=(record_key,),
        argsrepr=repr(label),
        kwargsrepr="{}",
        ignore_result=True,
    )
    from kombu.serialization import dumps

    for name, value in (headers or {}).items():
        message.headers[name] = value
    content_type, content_encoding, body = dumps(message.body, serializer="json")
    raw = body.encode(content_encoding) if isinstance(body, str) else body
    return json.dumps(
        {
            "body": base64.b64encode(raw).decode("ascii"),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": message.headers,
            "properties": {
                **message.properties,
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


@dataclass(frozen=True)
class QueuedMessage:
    """What a worker taking a message and the lost-message check need to know of it."""

    record: str  # the record key it runs
    task_id: str
    admitted: bool  # pushed by its rollout's admission and never pushed again since
    label: str = ""  # what Flower shows as the task's args


class NotARollout(ValueError):
    """A queued message the fleet does not run; its text says why."""


def read_taken(raw: str) -> QueuedMessage:
    """A taken message's facts, or :class:`NotARollout`. Only JSON is ever decoded: a message
    of any other content type (a pickle) is refused before its body is read."""
    try:
        message = json.loads(raw)
        headers, content_type = message["headers"], message.get("content-type")
        record = _record_of(message) if content_type == JSON_CONTENT_TYPE else None
        facts = (str(headers["id"]), headers.get(ADMITTED_HEADER), headers.get(REDELIVERED_HEADER))
    except (ValueError, LookupError, TypeError, AttributeError) as exc:
        raise NotARollout(f"not a task message ({type(exc).__name__}: {exc})") from None
    if content_type != JSON_CONTENT_TYPE:
        raise NotARollout(f"content type {content_type!r} refused: only JSON is accepted")
    if record is None:
        raise NotARollout(f"task {headers.get('task')!r} is not {TASK_NAME!r}")
    task_id, admitted, redelivered = facts
    label = str(headers.get("argsrepr") or "")
    return QueuedMessage(record, task_id, bool(admitted) and not redelivered, label)


def read_queued(raw: str) -> QueuedMessage | None:
    """A queued message's facts (``None`` if it is not a rollout's)."""
    try:
        return read_taken(raw)
    except NotARollout:
        return None


def record_of_message(entry: str) -> str | None:
    """The record key of a taken message, an entry of kombu's ``unacked`` hash (``None`` if
    not a rollout's)."""
    try:
        return _record_of(json.loads(entry)[0])
    except (ValueError, LookupError, TypeError):
        return None


def _record_of(message: dict[str, Any]) -> str | None:
    if message["headers"]["task"] != TASK_NAME:
        return None
    args = json.loads(base64.b64decode(message["body"]))[0]
    return str(args[0])


__all__ = [
    "ADMITTED_HEADER",
    "TASK_NAME",
    "NotARollout",
    "QueuedMessage",
    "admission_message",
    "new_task_id",
    "read_queued",
    "read_taken",
    "record_of_message",
    "task_message",
]
