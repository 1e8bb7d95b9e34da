"""Imported by every Python process started with this folder on ``PYTHONPATH``: with
``BENCH_PROFILE_OUT`` (a folder) set, samples the process's threads into ``<pid>.json``
there (``bench/profile.py`` reads its workers')."""

from __future__ import annotations

import os

if os.environ.get("BENCH_PROFILE_OUT"):
    from bench.stack_sampler import start

    start(os.path.join(os.environ["BENCH_PROFILE_OUT"], f"{os.getpid()}.json"))
