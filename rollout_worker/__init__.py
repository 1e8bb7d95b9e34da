"""A worker process: runs many rollouts at once on one asyncio loop. Its intake takes rollout
messages off the queue itself (``intake.py`` → ``execution.py`` → the v1/v2 carriers);
Celery's worker in the same process consumes no queue and carries only remote control
(revokes), heartbeats and the task events Flower shows (``celery_worker.py``, where the
runtime is one of Celery's bootsteps, and ``task_events.py``).
It reaches Redis only through ``rollout_core``'s store and never imports the gateway."""
