"""A worker process: a Celery consumer that runs many rollouts at once on one asyncio loop
(``tasks.py`` → ``runtime.py`` → ``execution.py`` → the v1/v2 carriers). It reaches Redis only
through ``rollout_core``'s store and never imports the gateway."""
