"""A process's own Prometheus registry and HTTP endpoint: ``/metrics`` and the probes
``/healthz`` and ``/readyz``.

Shared by every process kind that serves metrics: the workers (through
:mod:`regionbus.runtime.observability`, which tells how they use it) and client caches
(``ClientSettings.metrics_port``). A registry of its own per endpoint (never the global
default one, so several endpoints in one process, as in the tests, do not collide) holds:

- the figures a *collector* reads from the owner's counters at scrape time (Prometheus'
  "custom collector" pattern, :class:`MetricFamilies`), so each figure is counted in
  exactly one place;
- latency histograms in seconds (:meth:`MetricsEndpoint.histogram`, buckets
  :data:`LATENCY_BUCKETS_S` from 1 ms to 60 s or :data:`REPLAY_BUCKETS_S`), observed by
  the owner where the time is known;
- the process's own figures, from prometheus_client's collectors (``process_*``,
  ``python_gc_*``, ``python_info``), and ``regionbus_build_info{version, python}``.

``/healthz`` and ``/readyz`` answer 200 or 503 with the reason as text, from the owner's
:class:`regionbus.schemas.health.HealthChecks`; every other path gets 404.
"""

from __future__ import annotations

import platform
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.health import HEALTHZ_PATH, READYZ_PATH, HealthChecks, Probe

METRIC_PREFIX = "regionbus_"
"""Prefix of every metric name."""

Metric = CounterMetricFamily | GaugeMetricFamily
"""What a collector yields."""

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Upper bounds (seconds) of the latency histograms' buckets: from 1 ms (a Redis round trip
of a small batch) to a minute (a queue held full, a remote site away)."""

REPLAY_BUCKETS_S = (0.01, 0.05, *LATENCY_BUCKETS_S[LATENCY_BUCKETS_S.index(0.1) :], 120.0, 300.0)
"""Upper bounds (seconds) of the replay histograms' buckets: a durable client's replay reads
what was queued while it was away, from nothing to minutes of events (longer: ``+Inf``)."""


class MetricFamilies:
    """Builds the metric families of one scrape, with the worker's constant labels
    (``namespace``, ``member``) first on every sample.

    Args:
        constant_labels: ``{label: value}`` put on every sample, e.g.
            ``{"namespace": "geode.site1", "member": "server-host-12-ab12cd"}``.
    """

    def __init__(self, constant_labels: Mapping[str, str]) -> None:
        self._names = tuple(constant_labels)
        self._values = tuple(constant_labels.values())

    def counter(
        self,
        name: str,
        documentation: str,
        samples: Mapping[tuple[str, ...], float] | float,
        labels: tuple[str, ...] = (),
    ) -> CounterMetricFamily:
        """A counter family ``regionbus_<name>_total``.

        Args:
            name: Name without the prefix and without ``_total``.
            documentation: The HELP text.
            samples: The value, or ``{label values: value}`` for ``labels``.
            labels: Names of the per-sample labels (after the constant ones).
        """
        family = CounterMetricFamily(
            METRIC_PREFIX + name, documentation, labels=[*self._names, *labels]
        )
        self._fill(family, samples)
        return family

    def gauge(
        self,
        name: str,
        documentation: str,
        samples: Mapping[tuple[str, ...], float] | float,
        labels: tuple[str, ...] = (),
    ) -> GaugeMetricFamily:
        """A gauge family ``regionbus_<name>``; arguments as for :meth:`counter`."""
        family = GaugeMetricFamily(
            METRIC_PREFIX + name, documentation, labels=[*self._names, *labels]
        )
        self._fill(family, samples)
        return family

    def _fill(
        self,
        family: CounterMetricFamily | GaugeMetricFamily,
        samples: Mapping[tuple[str, ...], float] | float,
    ) -> None:
        if isinstance(samples, int | float):
            family.add_metric(list(self._values), samples)
            return
        for label_values, value in samples.items():
            family.add_metric([*self._values, *label_values], value)


class _CallbackCollector(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class MetricsEndpoint:
    """A worker's own metrics registry and, if asked for, its HTTP endpoint.

    Args:
        port: TCP port of the endpoint: None = no endpoint (the registry still answers
            :meth:`scrape`); 0 = any free port (read the bound one from :attr:`port`).
            Source: the worker's ``metrics_port`` setting.
        collect: Called at every scrape (on the endpoint's thread); returns the metric
            families, built from the worker's counters. It must only read.
        address: Address to listen on; loopback by default (the ``metrics_host``
            setting's default), so the figures are not offered to the whole network
            unless an operator asks (``0.0.0.0`` in a container).
        health: What ``/healthz`` and ``/readyz`` answer; None answers 404 there.
    """

    def __init__(
        self,
        port: int | None,
        collect: Callable[[], Iterable[Metric]],
        *,
        address: str = "127.0.0.1",
        health: HealthChecks | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_CallbackCollector(collect))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Info(METRIC_PREFIX + "build", "This regionbus build.", registry=self.registry).info(
            {"version": _regionbus_version(), "python": platform.python_version()}
        )
        self.health = health
        self._wanted_port = port
        self._address = address
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """Whether an endpoint is configured (a ``metrics_port`` is set): figures that cost
        something on a hot path (latency histograms) are only kept then."""
        return self._wanted_port is not None

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Mapping[str, str],
        buckets: tuple[float, ...] = LATENCY_BUCKETS_S,
    ) -> Histogram:
        """A histogram ``regionbus_<name>`` in this registry, its one child for ``labels``.

        Args:
            name: Name without the prefix, ending in its unit (``..._seconds``).
            documentation: The HELP text.
            labels: ``{label: value}`` of every sample (the worker's constant labels).
            buckets: Upper bounds of its buckets, in the unit of the name.

        Returns:
            The child to call ``observe(value)`` on.
        """
        family = Histogram(
            METRIC_PREFIX + name,
            documentation,
            list(labels),
            registry=self.registry,
            buckets=buckets,
        )
        return family.labels(**labels)

    def start(self) -> None:
        """Start serving ``/metrics`` on a daemon thread (nothing when no port is set).

        Raises:
            ConfigurationError: the port cannot be bound (in use, no permission).
        """
        if self._wanted_port is None or self._server is not None:
            return
        try:
            self._server, self._thread = _serve(
                self._address, self._wanted_port, _routes(make_wsgi_app(self.registry), self.health)
            )
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {self._address}:{self._wanted_port}: {exc}"
            ) from exc

    def stop(self) -> None:
        """Stop the endpoint and free its port (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def port(self) -> int | None:
        """The bound TCP port while serving, else None."""
        if self._server is None:
            return None
        return int(self._server.server_address[1])

    @property
    def address(self) -> str | None:
        """The address the endpoint listens on while serving (``127.0.0.1`` unless the
        ``metrics_host`` setting says otherwise), else None."""
        if self._server is None:
            return None
        return str(self._server.server_address[0])

    @property
    def url(self) -> str | None:
        """``http://<host>:<port>/metrics`` while serving (the loopback address when
        listening on every interface), else None."""
        port = self.port
        if port is None:
            return None
        host = "127.0.0.1" if self._address in ("0.0.0.0", "") else self._address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/metrics"

    def scrape(self) -> bytes:
        """The text exposition of the registry, as the endpoint would serve it."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


METRICS_PATH = "/metrics"
"""The path of the metrics; with :data:`HEALTHZ_PATH` and :data:`READYZ_PATH` the only ones
answered, every other gets 404."""

_TEXT = ("Content-Type", "text/plain; charset=utf-8")


def _routes(metrics: WSGIApplication, health: HealthChecks | None) -> WSGIApplication:
    """``metrics`` at :data:`METRICS_PATH` and the probes at theirs, 404 elsewhere:
    prometheus_client's app answers every path, which turns any URL of the host into a
    metrics page."""

    def route(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == METRICS_PATH:
            return metrics(environ, start_response)
        if health is not None and path in (HEALTHZ_PATH, READYZ_PATH):
            probe = _asked(health, path)
            # A new header list each time: wsgiref adds Content-Length to the list given.
            start_response("200 OK" if probe.ok else "503 Service Unavailable", [_TEXT])
            return [probe.reason.encode() + b"\n"]
        start_response("404 Not Found", [_TEXT])
        return [b"Not Found: metrics are at /metrics, probes at /healthz and /readyz\n"]

    return route


def _asked(health: HealthChecks, path: str) -> Probe:
    """The probe's answer; a check that raises is a failed probe (its error the reason)."""
    try:
        return health.liveness() if path == HEALTHZ_PATH else health.readiness()
    except Exception as exc:
        return Probe(False, f"probe failed: {type(exc).__name__}: {exc}")


def _regionbus_version() -> str:
    try:
        return version("regionbus")
    except PackageNotFoundError:
        return "unknown"


class _QuietHandler(WSGIRequestHandler):
    """No access-log line per scrape on standard error."""

    def log_message(self, format: str, *args: object) -> None:
        return


def _serve(address: str, port: int, app: WSGIApplication) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``app`` on ``address:port`` from a daemon thread, with the threading server of
    ``prometheus_client.start_http_server``."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(address, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


__all__ = [
    "LATENCY_BUCKETS_S",
    "METRICS_PATH",
    "METRIC_PREFIX",
    "REPLAY_BUCKETS_S",
    "Metric",
    "MetricFamilies",
    "MetricsEndpoint",
]
