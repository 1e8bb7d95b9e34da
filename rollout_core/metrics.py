"""Prometheus plumbing every fleet process shares; each side defines its own metrics
(``rollout_gateway/metrics.py``, ``rollout_worker/metrics.py``).

Processes sharing one port (``rollout-fleet gateway --workers N``) write to
``PROMETHEUS_MULTIPROC_DIR`` and a scrape of any of them merges all (prometheus-client's
multiprocess mode).
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def registry() -> CollectorRegistry:
    """What a scrape of this process shows: its own metrics, or with ``MULTIPROC_ENV`` set,
    those of every process writing there."""
    if MULTIPROC_ENV not in os.environ:
        return REGISTRY
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
    return merged


__all__ = ["MULTIPROC_ENV", "registry"]
