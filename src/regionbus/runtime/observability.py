"""How a regionbus process exposes its metrics and writes its logs.

**Metrics.** Every worker (cache server, gateway sender, gateway receiver, async event
queue dispatcher) owns one :class:`MetricsEndpoint`: a ``prometheus_client``
``CollectorRegistry`` of its own (never the global default one, so several workers in one
process, as in the tests, do not collide) and, when a ``metrics_port`` is set, an HTTP
endpoint serving it at ``/metrics`` until the worker stops. The figures come from one
*collector* per worker that reads the worker's own counters at scrape time (Prometheus'
"custom collector" pattern), so each figure is counted in exactly one place and the
``stats`` objects the tests and the CLI read can never disagree with what is scraped.

Names follow the Prometheus conventions: prefix ``regionbus_``, counters end in
``_total``, a unit in the name where there is one (``_events``, ``_seconds``), and labels
``namespace`` and ``member`` on every sample, plus ``region``, ``kind``, ``client``,
``sender``, ``receiver`` or ``queue`` where a figure is per one of those.

**Logs.** :func:`configure_logging` sets the root logger to the classic text lines
(the default) or to one JSON object per line (``python-json-logger``) carrying the
``member`` and ``namespace`` of the process as fields, for log shippers.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Literal
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector
from pythonjsonlogger.json import JsonFormatter

from regionbus.schemas.errors import ConfigurationError

METRIC_PREFIX = "regionbus_"
"""Prefix of every metric name."""

LogFormat = Literal["text", "json"]
"""``"text"``: ``time level logger: message`` lines; ``"json"``: one JSON object a line."""

TEXT_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The text line format (the default, the same lines as before JSON logs existed)."""

_JSON_LOG_FIELDS = ("asctime", "levelname", "name", "message")

Metric = CounterMetricFamily | GaugeMetricFamily
"""What a collector yields."""


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
    """

    def __init__(
        self,
        port: int | None,
        collect: Callable[[], Iterable[Metric]],
        *,
        address: str = "127.0.0.1",
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_CallbackCollector(collect))
        self._wanted_port = port
        self._address = address
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start serving ``/metrics`` on a daemon thread (nothing when no port is set).

        Raises:
            ConfigurationError: the port cannot be bound (in use, no permission).
        """
        if self._wanted_port is None or self._server is not None:
            return
        try:
            self._server, self._thread = _serve_metrics_only(
                self._address, self._wanted_port, make_wsgi_app(self.registry)
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
"""The one path the endpoint answers; every other gets 404."""


def _metrics_only(app: WSGIApplication) -> WSGIApplication:
    """``app`` at :data:`METRICS_PATH` only: prometheus_client's app answers every path,
    which turns any URL of the host into a metrics page."""

    def only_metrics(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"Not Found: metrics are at /metrics\n"]
        return app(environ, start_response)

    return only_metrics


class _QuietHandler(WSGIRequestHandler):
    """No access-log line per scrape on standard error."""

    def log_message(self, format: str, *args: object) -> None:
        return


def _serve_metrics_only(
    address: str, port: int, app: WSGIApplication
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``app`` at ``/metrics`` on ``address:port`` from a daemon thread, with the
    threading server of ``prometheus_client.start_http_server``."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(address, port, _metrics_only(app), Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


class ServesMetrics:
    """Mixin of a worker (cache server, gateway worker) that owns a :class:`MetricsEndpoint`
    in ``self._metrics``: the read-only view of it operators and tests use."""

    _metrics: MetricsEndpoint

    @property
    def metrics_port(self) -> int | None:
        """TCP port of the running metrics endpoint (the setting's, or the one bound for
        0), None when there is none or the worker is not running."""
        return self._metrics.port

    @property
    def metrics_address(self) -> str | None:
        """The address the metrics endpoint listens on while it runs, else None."""
        return self._metrics.address

    @property
    def metrics_url(self) -> str | None:
        """``http://127.0.0.1:<port>/metrics`` while the endpoint runs, else None."""
        return self._metrics.url

    def scrape_metrics(self) -> bytes:
        """The Prometheus text exposition of this worker's metrics (also without an
        endpoint)."""
        return self._metrics.scrape()


def json_log_formatter(fields: Mapping[str, str]) -> logging.Formatter:
    """A formatter writing each record as one JSON object.

    Args:
        fields: Constant fields of the process added to every record, e.g.
            ``{"member": "server-host-12-ab12cd", "namespace": "geode.site1"}``.

    Returns:
        A formatter whose lines carry ``asctime``, ``levelname``, ``name``, ``message``,
        the ``fields``, any ``extra=`` of the call, and ``exc_info`` when there is one.
    """
    return JsonFormatter(list(_JSON_LOG_FIELDS), static_fields=dict(fields))


def configure_logging(
    log_format: LogFormat,
    *,
    verbose: bool = False,
    fields: Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
) -> None:
    """Set the root logger of a worker process: level, one stream handler, format.

    Replaces handlers set before (so a CLI command can call it after reading its
    settings).

    Args:
        log_format: ``"text"`` (default of every ``log_format`` setting) or ``"json"``.
        verbose: DEBUG instead of INFO.
        fields: Constant fields of JSON lines (member id, namespace); ignored for text.
        stream: Where to write; standard error by default.

    Raises:
        ConfigurationError: an unknown format.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if log_format == "json":
        handler.setFormatter(json_log_formatter(fields or {}))
    elif log_format == "text":
        handler.setFormatter(logging.Formatter(TEXT_LOG_FORMAT))
    else:
        raise ConfigurationError(f"log_format must be 'text' or 'json', not {log_format!r}")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True
    )


__all__ = [
    "METRIC_PREFIX",
    "TEXT_LOG_FORMAT",
    "LogFormat",
    "Metric",
    "MetricFamilies",
    "MetricsEndpoint",
    "configure_logging",
    "json_log_formatter",
]
