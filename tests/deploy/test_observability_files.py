"""``deploy/``: the Prometheus scrape config and alerts, the Grafana dashboard and the KEDA
ScaledObject parse, ask only for metrics the fleet exports (a misspelt name would chart or
scale on nothing, silently), and scrape the ports docker-compose.yml declares."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from rollout_core.metrics import registry
from rollout_core.store import FleetCounts, FleetFigures, FleetWorkers
from rollout_gateway.metrics import fleet_registry
from rollout_worker import metrics
from tests.harness import REPO

DEPLOY = REPO / "deploy"
METRIC = re.compile(r"\brollout_fleet_\w+")


def exported() -> set[str]:
    """Every sample name a gateway or worker can expose."""
    names: set[str] = set()
    fleet = fleet_registry(FleetFigures(0, 0.0, FleetCounts(0, 0, 0), FleetWorkers()))
    assert metrics.INFLIGHT is not None  # the worker's metrics, defined on import
    for collected in (registry(), fleet):
        assert isinstance(collected, CollectorRegistry)
        for family in collected.collect():
            names.add(family.name)
            suffixes = ("_total", "_bucket", "_count", "_sum", "_created")
            names.update(f"{family.name}{suffix}" for suffix in suffixes)
    return {name for name in names if name.startswith("rollout_fleet_")}


def expressions() -> dict[str, list[str]]:
    """Every query in deploy/, by file."""
    dashboard = json.loads((DEPLOY / "grafana/rollout-fleet.json").read_text())
    alerts = yaml.safe_load((DEPLOY / "prometheus/alerts.yml").read_text())
    scaler = list(yaml.safe_load_all((DEPLOY / "keda/worker-scaledobject.yaml").read_text()))
    return {
        "grafana": [t["expr"] for p in dashboard["panels"] for t in p["targets"]],
        "alerts": [rule["expr"] for group in alerts["groups"] for rule in group["rules"]],
        "keda": [
            trigger["metadata"]["query"]
            for trigger in scaler[0]["spec"]["triggers"]
            if trigger["type"] == "prometheus"
        ],
    }


@pytest.mark.parametrize("source", ["grafana", "alerts", "keda"])
def test_every_query_asks_for_metrics_the_fleet_exports(source: str) -> None:
    queries = expressions()[source]
    assert queries
    asked = {name for query in queries for name in METRIC.findall(query)}
    assert asked
    assert asked <= exported(), asked - exported()


def test_the_metric_check_catches_a_misspelt_name() -> None:
    assert "rollout_fleet_queue_deph" not in exported()
    assert "rollout_fleet_queue_depth" in exported()


def _compose_default(variable: str) -> str:
    text = (REPO / "docker-compose.yml").read_text()
    match = re.search(rf"\$\{{{variable}:-(\d+)\}}", text)
    assert match is not None, variable
    return match.group(1)


def test_prometheus_scrapes_the_ports_compose_declares() -> None:
    config: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway_target = jobs["rollout-gateway"]["static_configs"][0]["targets"][0]
    assert gateway_target == f"gateway:{_compose_default('GATEWAY_PORT')}"
    workers = jobs["rollout-worker"]["dns_sd_configs"][0]
    assert workers["names"] == ["worker"]
    assert str(workers["port"]) == _compose_default("WORKER_METRICS_PORT")
    assert config["rule_files"] == ["alerts.yml"]
    assert (DEPLOY / "prometheus" / config["rule_files"][0]).is_file()


def test_the_scaled_object_targets_the_queue_the_fleet_uses() -> None:
    scaler, auth = yaml.safe_load_all((DEPLOY / "keda/worker-scaledobject.yaml").read_text())
    assert (scaler["kind"], auth["kind"]) == ("ScaledObject", "TriggerAuthentication")
    redis = next(t for t in scaler["spec"]["triggers"] if t["type"] == "redis")
    from rollout_core.settings import FleetSettings

    assert redis["metadata"]["listName"] == FleetSettings.model_fields["queue"].default
    assert redis["authenticationRef"]["name"] == auth["metadata"]["name"]


def test_the_dashboard_is_grafana_json() -> None:
    dashboard = json.loads((DEPLOY / "grafana/rollout-fleet.json").read_text())
    assert dashboard["uid"] == "rollout-fleet"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
