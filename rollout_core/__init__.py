"""The shared core of the fleet: what gateways and workers both use, and nothing else.

* ``store/``      the fleet's state in Redis: keys, record fields and statuses defined once
                  (``schema``), the Lua scripts, and :class:`~rollout_core.store.RecordStore`,
                  the only code that issues Redis commands;
* ``queue/``      the Celery app configuration, the task message envelope and the broker
                  transport;
* ``protocols/``  each protocol generation's record: admission fields, the request a worker
                  reads back, the results the fleet makes itself;
* ``settings``, ``secrets``, ``views`` (status/ls/export), ``logs``, ``tracing``, ``metrics``.

Dependencies point one way: ``rollout_fleet`` (the CLI) → ``rollout_gateway`` and
``rollout_worker`` → ``rollout_core`` → ``rollout_sdk``. The gateway and the worker never
import each other (``tests/test_architecture.py``).
"""
