"""Contract: the task messages the store's scripts enqueue are the ones Celery itself would.

If a Celery/kombu upgrade changes the protocol-2 message or kombu's Redis envelope, this
fails before any rollout is lost to an unreadable message.
"""

from __future__ import annotations

import base64
import json

import redis
from celery import Celery
from kombu import Connection

from rollout_core.queue.envelope import (
    TASK_NAME,
    new_task_id,
    record_of_message,
    task_message,
)
from rollout_core.store.schema import UNACKED, UNACKED_INDEX, Keys
from rollout_fleet.redis_server import RedisServer

# Per-message values, plus two properties send_task adds only because it copies its
# unknown keyword options into the properties (the headers carry the same values).
VOLATILE = {
    ("properties", "delivery_tag"),
    ("properties", "reply_to"),
    ("headers", "origin"),
    ("properties", "argsrepr"),
    ("properties", "kwargsrepr"),
}


def _stable(message: dict[str, object]) -> dict[str, object]:
    return {
        section: (
            {k: v for k, v in value.items() if (section, k) not in VOLATILE}
            if isinstance(value, dict)
            else value
        )
        for section, value in message.items()
    }


def test_our_envelope_matches_what_send_task_publishes(redis_server: RedisServer) -> None:
    url = redis_server.url_for(1000)
    app = Celery("contract", broker=url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    record = Keys("rf").record("v1", "rollout-42")
    task_id = new_task_id()
    app.send_task(
        TASK_NAME,
        args=(record,),
        task_id=task_id,
        queue="contract-q",
        argsrepr=repr("rollout-42"),
        kwargsrepr="{}",
        ignore_result=True,
    )
    client = redis.Redis.from_url(url)
    try:
        published = json.loads(client.lpop("contract-q"))  # type: ignore[arg-type]
    finally:
        client.flushdb()
        client.close()
    ours = json.loads(task_message(app, record, "rollout-42", "contract-q", task_id=task_id))
    assert _stable(ours) == _stable(published)
    assert json.loads(base64.b64decode(ours["body"]))[0] == [record]
    assert ours["properties"]["delivery_tag"] != published["properties"]["delivery_tag"]


def test_every_message_has_a_task_id_of_its_own_and_url_safe() -> None:
    """A revoked id stays revoked for hours; a later message of the same rollout
    id (a re-admission) must not carry it."""
    app = Celery("ids")
    record = Keys("rf").record("v1", "a/b c")
    ids = {json.loads(task_message(app, record, "a/b c", "q"))["headers"]["id"] for _ in range(2)}
    assert len(ids) == 2
    assert all(c in "0123456789abcdef-" for c in "".join(ids))


def test_a_taken_message_kombu_holds_unacked_names_its_record(redis_server: RedisServer) -> None:
    """The sweeper requeues rollouts whose message a dead worker took: it reads kombu's own
    ``unacked`` entries, so their format is pinned here against kombu itself."""
    url = redis_server.url_for(1002)
    app = Celery("contract", broker=url)
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    record = Keys("rf").record("v2", "rollout-7")
    client.lpush("taken-q", task_message(app, record, "rollout-7", "taken-q"))
    options = {"unacked_key": UNACKED, "unacked_index_key": UNACKED_INDEX}
    try:
        with Connection(url, transport_options=options) as connection:
            queue = connection.SimpleQueue("taken-q")
            queue.get(timeout=5)  # taken, never acked: a worker that died right here
            (entry,) = client.hvals(UNACKED)
            assert client.zcard(UNACKED_INDEX) == 1
            queue.close()
    finally:
        client.flushdb()
        client.close()
    assert record_of_message(entry) == record
    assert record_of_message("[]") is None
    assert record_of_message("not json") is None
