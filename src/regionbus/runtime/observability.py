"""How a regionbus process exposes its metrics and writes its logs.

**Metrics.** Every worker (cache server, gateway sender, gateway receiver, async event
queue dispatcher) owns one :class:`MetricsEndpoint` (:mod:`regionbus.schemas.metrics_endpoint`,
shared with client caches): a registry of its own and, when a ``metrics_port`` is set, an
HTTP endpoint serving ``/metrics``, ``/healthz`` and ``/readyz`` until the worker stops. The
counters and gauges come from one *collector* per worker that reads the worker's own
counters at scrape time, so the ``stats`` objects the tests and the CLI read can never
disagree with what is scraped; latencies are histograms the worker observes itself, kept
only while an endpoint is configured (:attr:`MetricsEndpoint.enabled`).

Names follow the Prometheus conventions: prefix ``regionbus_``, counters end in
``_total``, a unit in the name where there is one (``_events``, ``_seconds``), and labels
``namespace`` and ``member`` on every sample, plus ``region``, ``kind``, ``client``,
``sender``, ``receiver`` or ``queue`` where a figure is per one of those.

**Probes.** ``/healthz`` (liveness) and ``/readyz`` (readiness) answer from the worker
itself (:class:`regionbus.runtime.worker.BackgroundWorker`, :mod:`regionbus.schemas.health`).

**Logs.** :func:`configure_logging` sets the root logger to the classic text lines
(the default) or to one JSON object per line (``python-json-logger``) carrying the
``member`` and ``namespace`` of the process as fields, for log shippers.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import IO, Literal

from pythonjsonlogger.json import JsonFormatter

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.metrics_endpoint import (
    LATENCY_BUCKETS_S,
    METRIC_PREFIX,
    REPLAY_BUCKETS_S,
    Metric,
    MetricFamilies,
    MetricsEndpoint,
)

LogFormat = Literal["text", "json"]
"""``"text"``: ``time level logger: message`` lines; ``"json"``: one JSON object a line."""

TEXT_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The text line format (the default, the same lines as before JSON logs existed)."""

_JSON_LOG_FIELDS = ("asctime", "levelname", "name", "message")


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
    "LATENCY_BUCKETS_S",
    "METRIC_PREFIX",
    "REPLAY_BUCKETS_S",
    "TEXT_LOG_FORMAT",
    "LogFormat",
    "Metric",
    "MetricFamilies",
    "MetricsEndpoint",
    "ServesMetrics",
    "configure_logging",
    "json_log_formatter",
]
