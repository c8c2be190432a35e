"""Host-side checks of the compose file's ``observability`` profile, run by
scripts/compose-check.sh beside the two sites (docker-compose.yml with
docker-compose.two-sites.yml):

- Prometheus (127.0.0.1:9090) scrapes every regionbus worker of the two sites, and each is
  up;
- every alert rule of docker/observability/alerts.yml is loaded and evaluates without an
  error (a rule whose query is wrong, a many-to-many match say, reports its error here);
- while a client puts into site A, each main panel of the Grafana dashboard
  (:data:`MAIN_PANELS`) returns data: every query of the panel, run against Prometheus as
  Grafana would run it, gives at least one finite value;
- with ``--grafana``, Grafana (127.0.0.1:3000) serves the provisioned dashboard to an
  anonymous viewer, with the panels of the file;
- with ``--stopped SERVICE`` (instead of the above), the alert RegionbusWorkerDown is
  active for that worker, which the caller stopped.

    .venv/bin/python scripts/compose_observability.py [--grafana]
    .venv/bin/python scripts/compose_observability.py --stopped gateway-receiver-a

Every wait is on a condition with a deadline; the first failure ends the run with status 1
and says what did not happen.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from regionbus import ALL_KEYS, ClientCache, RegionBusError

ROOT = Path(__file__).resolve().parents[1]
OBSERVABILITY = ROOT / "docker" / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "regionbus.json"
ALERTS = OBSERVABILITY / "alerts.yml"
PROMETHEUS = "http://127.0.0.1:9090"
GRAFANA = "http://127.0.0.1:3000"

WORKERS = (
    "cache-server-1",
    "cache-server-2",
    "site-b-cache-server",
    "gateway-sender-a-to-b",
    "gateway-receiver-b",
    "gateway-sender-b-to-a",
    "gateway-receiver-a",
)
"""The services of the two sites Prometheus must scrape (docker/observability/prometheus.yml)."""

MAIN_PANELS = (
    "Workers up",
    "Buckets: primaries per server, and without one",
    "Operations applied /s",
    "Events routed to subscription queues /s",
    "Put → queued p50 / p99",
    "Batch apply p99",
    "Subscription backlog (events not acked)",
    "Gateway sender backlog (events)",
    "Gateway batch round trip p99",
)
"""Panels that show data whenever the two sites carry puts (the others need a deep
queue, dead letters or durable clients)."""

TIMEOUT_S = 240.0
SITE_A: dict[str, Any] = {"namespace": "regionbus", "kafka_bootstrap_servers": "127.0.0.1:9092"}


class CheckError(Exception):
    """A check did not see what it waited for."""


def say(message: str) -> None:
    print(f"compose-observability: {message}", flush=True)


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.load(response)


def prometheus_api(path: str, **query: str) -> Any:
    """``data`` of a Prometheus HTTP API answer; raises CheckError when it is not a success."""
    url = f"{PROMETHEUS}/api/v1/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    answer = get_json(url)
    if answer.get("status") != "success":
        raise CheckError(f"Prometheus {path} {query}: {answer}")
    return answer["data"]


def wait_for(what: str, check: Callable[[], str | None], timeout_s: float = TIMEOUT_S) -> None:
    """Call ``check`` until it returns None (done); else it returns what is still missing,
    reported when the deadline passes."""
    deadline = time.monotonic() + timeout_s
    missing: str | None = "nothing asked yet"
    while time.monotonic() < deadline:
        try:
            missing = check()
        except (OSError, ValueError, CheckError) as exc:
            missing = f"{type(exc).__name__}: {exc}"
        if missing is None:
            return
        time.sleep(1.0)
    raise CheckError(f"{what}: not within {timeout_s:.0f} s: {missing}")


def targets_up() -> str | None:
    active = prometheus_api("targets", state="active")["activeTargets"]
    health = {t["labels"].get("service"): t["health"] for t in active}
    down = {w: health.get(w, "not scraped") for w in WORKERS if health.get(w) != "up"}
    return None if not down else f"{down}"


def rules_evaluated() -> str | None:
    groups = prometheus_api("rules")["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"] if r["type"] == "alerting"}
    wanted = [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    missing = [name for name in wanted if name not in loaded]
    if missing:
        return f"alert rules not loaded: {missing}"
    failing = {n: loaded[n].get("lastError") for n in wanted if loaded[n]["health"] == "err"}
    if failing:
        raise CheckError(f"alert rules evaluate with errors: {failing}")
    unknown = [n for n in wanted if loaded[n]["health"] != "ok"]
    return None if not unknown else f"not evaluated yet: {unknown}"


def panels() -> dict[str, list[str]]:
    """``{title: [query, ...]}`` of the dashboard's panels (rows left out)."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        p["title"]: [t["expr"] for t in p.get("targets", [])]
        for p in dashboard["panels"]
        if p["type"] != "row"
    }


def finite_values(query: str) -> int:
    result = prometheus_api("query", query=query)["result"]
    return sum(1 for r in result if math.isfinite(float(r["value"][1])))


@contextmanager
def puts_into_site_a() -> Iterator[None]:
    """A client putting into region flights every 0.1 s, and another subscribed to every
    key of it, until the block ends: the panels of rates and latencies need changes that
    reach a subscription queue within their window."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def put() -> None:
        try:
            with ClientCache(**SITE_A, read_timeout_ms=30_000) as subscriber:
                subscriber.create_region("flights").register_interest(ALL_KEYS)
                with ClientCache(**SITE_A, read_timeout_ms=30_000) as writer:
                    region = writer.create_region("flights")
                    n = 0
                    while not stop.wait(0.1):
                        region.put(f"observability-{n % 50}", {"n": n})
                        n += 1
        except (RegionBusError, OSError) as exc:
            failures.append(exc)

    thread = threading.Thread(target=put, name="observability-puts", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
    if failures:
        raise CheckError(f"the clients failed: {failures[0]!r}")


def check_prometheus() -> None:
    wait_for("every worker scraped and up", targets_up)
    say(f"Prometheus scrapes the {len(WORKERS)} workers of the two sites, each up")
    wait_for("every alert rule loaded and evaluated", rules_evaluated)
    say("every alert rule of alerts.yml is loaded and evaluates without error")
    found = panels()
    unknown = [t for t in MAIN_PANELS if t not in found]
    if unknown:
        raise CheckError(f"main panels missing from {DASHBOARD.name}: {unknown}")
    with puts_into_site_a():
        for title in MAIN_PANELS:

            def has_data(title: str = title) -> str | None:
                empty = [q for q in found[title] if finite_values(q) == 0]
                return None if not empty else f"no data for {empty}"

            wait_for(f"panel {title!r} returns data", has_data)
            say(f"OK panel {title!r}: every query returns data")


def alert_state(alert: str, service: str) -> str | None:
    """The state (``pending``, ``firing``) of ``alert`` for ``service``; None when it is
    not active."""
    for active in prometheus_api("alerts")["alerts"]:
        labels = active["labels"]
        if labels.get("alertname") == alert and labels.get("service") == service:
            return str(active["state"])
    return None


def check_worker_down_alert(service: str) -> None:
    """``service`` was stopped: RegionbusWorkerDown must become active for it (pending, as
    its ``for`` has not passed yet, or firing)."""
    wait_for(
        f"RegionbusWorkerDown active for the stopped {service}",
        lambda: (
            None
            if alert_state("RegionbusWorkerDown", service) in ("pending", "firing")
            else "not active"
        ),
        timeout_s=120,
    )
    say(
        f"OK alert RegionbusWorkerDown is {alert_state('RegionbusWorkerDown', service)} "
        f"for the stopped {service}"
    )


def check_grafana() -> None:
    wait_for(
        "Grafana healthy",
        lambda: None if get_json(f"{GRAFANA}/api/health").get("database") == "ok" else "not ok",
    )
    served = get_json(f"{GRAFANA}/api/dashboards/uid/regionbus")["dashboard"]
    titles = [p["title"] for p in served["panels"] if p["type"] != "row"]
    if titles != list(panels()):
        raise CheckError(f"Grafana serves panels {titles}, the file has {list(panels())}")
    say(f"Grafana serves dashboard 'regionbus' to an anonymous viewer, its {len(titles)} panels")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grafana", action="store_true", help="Grafana runs too: check it.")
    parser.add_argument(
        "--stopped",
        metavar="SERVICE",
        help="Only check that RegionbusWorkerDown is active for this stopped worker.",
    )
    args = parser.parse_args(argv)
    try:
        if args.stopped:
            check_worker_down_alert(args.stopped)
            return 0
        check_prometheus()
        if args.grafana:
            check_grafana()
        else:
            say("Grafana not checked: it does not run here (no image); the panels' queries ran")
            say("against Prometheus above, as Grafana runs them")
    except CheckError as exc:
        say(f"FAILED: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
