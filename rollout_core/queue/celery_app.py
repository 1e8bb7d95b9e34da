"""The Celery app: the one configuration every process that touches the broker loads.

Workers (``rollout-fleet worker``: Celery's worker for control, heartbeats and task events,
while the worker's intake takes the ``rollout.run`` messages itself), Flower (``rollout-fleet
flower``) and gateways (which build task messages with it) all load this module, so they
agree on the broker, the queue and the message format.

A message may reach workers more than once; correctness comes from the store's per-rollout leases
(``rollout_core/store``), not from Celery: duplicates are expected and harmless.
"""

from __future__ import annotations

from celery import Celery

from rollout_core.queue.broker import control_exchange, event_exchange, transport_for
from rollout_core.settings import FleetSettings
from rollout_core.store.schema import UNACKED, UNACKED_INDEX, UNACKED_MUTEX

settings = FleetSettings()

app = Celery("rollout_fleet")
app.conf.update(
    broker_url=settings.redis_dsn,
    broker_transport=transport_for(settings.redis_dsn),  # kombu's, hardened (broker.py)
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    broker_transport_options={
        "visibility_timeout": settings.visibility_timeout_seconds,
        "unacked_key": UNACKED,
        "unacked_index_key": UNACKED_INDEX,
        "unacked_mutex_key": UNACKED_MUTEX,
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
        "socket_timeout": 30,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 25,
        "master_name": settings.sentinel_master,  # read with a sentinel:// URL only
    },
    # Our Redis records are the results; Celery's backend would only duplicate them.
    task_ignore_result=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    task_default_queue=settings.queue,
    # Remote control (ping, revoke, shutdown) and task events go over exchanges named for the
    # fleet: Redis's pub/sub spans databases' names, so fleets sharing one would otherwise see,
    # revoke and shut down each other's workers, Flower included.
    control_exchange=control_exchange(settings.key_prefix),
    event_exchange=event_exchange(settings.key_prefix),
    event_queue_prefix=event_exchange(settings.key_prefix),
    task_send_sent_event=False,
    # Workers take their messages themselves (rollout_worker/intake.py); Celery's pool only
    # carries --concurrency, the slots the intake fills.
    worker_pool="threads",
    worker_concurrency=settings.concurrency,
    worker_send_task_events=settings.task_events,  # what Flower shows
    worker_disable_rate_limits=True,
    worker_cancel_long_running_tasks_on_connection_loss=False,
    worker_hijack_root_logger=False,
)

__all__ = ["app", "settings"]
