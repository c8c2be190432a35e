"""The compose file's ``observability`` profile, read without a Docker engine: Prometheus
scrapes exactly the workers the compose files run, the alert rules and the dashboard ask
only for metrics regionbus exports (as docs/observability.md lists them), and the
dashboard's panels are what the compose check looks for. scripts/compose-check.sh runs the
profile for real."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "docker" / "observability"
sys.path.insert(0, str(ROOT / "scripts"))
from compose_model import COMPOSE_SETS, load  # noqa: E402

_METRIC = re.compile(r"\bregionbus_[a-z0-9_]+")
_HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "compose_observability", ROOT / "scripts" / "compose_observability.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented_metrics() -> set[str]:
    """Every metric name of docs/observability.md's tables, short forms (`` `_lost_total` ``
    after `` `regionbus_bucket_primaries_gained_total` ``) spelled out."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "observability.md").read_text().splitlines():
        if not line.startswith("| `regionbus_"):
            continue
        cell = line.split("|")[1]
        quoted = re.findall(r"`([^`]+)`", cell)
        full = [re.sub(r"\{.*", "", q) for q in quoted if q.startswith("regionbus_")]
        names.update(full)
        for short in (q for q in quoted if q.startswith("_")):
            for name in full:
                parts = name.split("_")
                names.update("_".join(parts[:i]) + short for i in range(2, len(parts)))
    return names


def _referenced(text: str) -> set[str]:
    found = set()
    for name in _METRIC.findall(text):
        for suffix in _HISTOGRAM_SERIES:
            if name.endswith("_seconds" + suffix):
                name = name.removesuffix(suffix)
        found.add(name)
    return found


def _dashboard() -> dict[str, Any]:
    path = OBSERVABILITY / "grafana" / "dashboards" / "regionbus.json"
    return dict(json.loads(path.read_text()))


def test_the_documented_short_forms_are_spelled_out() -> None:
    documented = _documented_metrics()
    assert "regionbus_bucket_primaries_lost_total" in documented
    assert "regionbus_gateway_receiver_dead_letters_total" in documented
    assert "regionbus_buckets_without_primary" in documented


@pytest.mark.parametrize(
    "path",
    [OBSERVABILITY / "alerts.yml", OBSERVABILITY / "grafana" / "dashboards" / "regionbus.json"],
    ids=["alerts", "dashboard"],
)
def test_alerts_and_panels_ask_only_for_metrics_regionbus_exports(path: Path) -> None:
    referenced = _referenced(path.read_text())
    assert referenced, f"{path.name} names no regionbus metric"
    assert sorted(referenced - _documented_metrics()) == []


def test_prometheus_scrapes_every_worker_of_the_compose_files_and_nothing_else() -> None:
    compose = load([ROOT / f for f in COMPOSE_SETS["two-sites"]])
    workers = {
        name
        for name, service in compose["services"].items()
        if any(
            k.endswith("METRICS_PORT") and str(v) == "9464"
            for k, v in (service.get("environment") or {}).items()
        )
    }
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (dns,) = job["dns_sd_configs"]
    assert dns["port"] == 9464
    assert set(dns["names"]) == workers
    assert set(_script().WORKERS) == workers
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_the_profile_mounts_the_files_it_reads() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["observability"]
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is missing"
    mounted = " ".join(services["prometheus"]["volumes"])
    assert "alerts.yml:/etc/prometheus/alerts.yml" in mounted


def test_every_alert_has_a_duration_a_severity_and_a_summary() -> None:
    (group,) = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())["groups"]
    names = [rule["alert"] for rule in group["rules"]]
    assert len(names) == len(set(names))
    for rule in group["rules"]:
        assert rule["for"], rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    documented = (ROOT / "docs" / "observability.md").read_text()
    assert [n for n in names if f"| `{n}` |" not in documented] == []


def test_the_dashboard_reads_the_provisioned_data_source_and_has_the_checked_panels() -> None:
    datasources = yaml.safe_load(
        (OBSERVABILITY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    (uid,) = [d["uid"] for d in datasources]
    dashboard = _dashboard()
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles))
    for panel in panels:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(t["expr"] for t in panel["targets"]), panel["title"]
    assert set(_script().MAIN_PANELS) <= set(titles)
