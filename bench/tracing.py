"""``bench.core``'s phase (t): what traces cost. Phase (a) again, with tracing off and on
at 1 % sampling, in alternating rounds on the run's Kafka and Redis.

Each run has a cache server of its own (a namespace of its own) and a writer and
subscribers of its own: off, none of them turns tracing on; on, all of them do
(the writer's ``tracing_sample_ratio`` 0.01, so one put in a hundred is traced writer ->
server -> every subscriber; the server starts no trace of its own, its default). Every
traced process exports its spans over OTLP/HTTP (the SDK's batch span processor) to a
collector this benchmark runs on the loopback, which takes them and keeps nothing. Rounds
alternate which goes first, so both see the same moments of a noisy machine; the medians
are compared. On a shared
machine the throughput of one round swings by more than tracing costs, so the CPU each
process spends per operation (writer, server, subscribers) is reported beside it: the cost
that bounds throughput once the cores are busy.
"""

from __future__ import annotations

import logging
import os
import secrets
import statistics
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from bench import progress
from bench.phases import regionbus_throughput
from bench.report import Throughput
from bench.server import server_services
from bench.services import REGION, BenchOptions
from bench.summary import SummaryRow
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings
from regionbus.devstack import LocalStack

log = logging.getLogger("regionbus.bench")

SAMPLE_RATIO: Final = 0.01
"""The sampling the overhead is measured at."""
OVERHEAD_TARGET: Final = 0.05
"""Most throughput tracing at :data:`SAMPLE_RATIO` may cost."""
ROUNDS: Final = 4
"""Rounds of one run off and one on: an even number, as the first run of a round has been
the faster one (the second follows its predecessor's teardown), and each goes first in
half of them."""

_PROCESSES: Final = ("writer", "server", "readers")
_TRACED: Final = {"tracing_enabled": True, "tracing_sample_ratio": SAMPLE_RATIO}


def _cpu_all(figures: Throughput) -> float:
    """CPU µs per op of the writer, the server and the subscribers together."""
    return sum(figures.cpu_us_per_op(p) for p in _PROCESSES)


@dataclass(frozen=True, slots=True)
class TracingFigures:
    """Phase (a) with tracing off and on, one figure per round each.

    Attributes:
        off: The rounds without tracing.
        on: The rounds with tracing on at :data:`SAMPLE_RATIO`.
    """

    off: list[Throughput]
    on: list[Throughput]

    def ops_per_s(self, traced: bool) -> float:
        """Median ops applied per second."""
        return statistics.median(t.acked_per_s for t in (self.on if traced else self.off))

    def cpu_us(self, traced: bool, process: str) -> float:
        """Median CPU µs per op of ``process`` (``writer``, ``server``, ``readers``), or
        of the three (``all``)."""
        runs = self.on if traced else self.off
        if process == "all":
            return statistics.median(_cpu_all(t) for t in runs)
        return statistics.median(t.cpu_us_per_op(process) for t in runs)

    @property
    def overhead(self) -> float:
        """Throughput lost to tracing: ``1 - on / off`` of the medians (negative: none
        measurable above the noise)."""
        return 1 - self.ops_per_s(True) / self.ops_per_s(False)

    @property
    def cpu_overhead(self) -> float:
        """CPU per op that tracing adds, writer, server and subscribers together:
        ``on / off - 1`` of the medians."""
        return self.cpu_us(True, "all") / self.cpu_us(False, "all") - 1


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that takes every export and keeps nothing (counts them)."""

    exports = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).exports += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per export would fill the benchmark's output."""


@contextmanager
def _collector() -> Iterator[str]:
    """A local OTLP/HTTP collector on the loopback for the run's spans: its endpoint.
    Every traced process exports there, as it would to an OpenTelemetry Collector."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment (the writer's; the subscribers' children
    inherit it) for the duration."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _one_run(
    local: LocalStack,
    options: BenchOptions,
    work_dir: Path,
    collector: str | None,
    round_: int,
) -> Throughput:
    """Phase (a) on a server of its own, traced (exporting to ``collector``) or not."""
    traced = collector is not None
    namespace = f"bench.{secrets.token_hex(3)}"
    env: dict[str, str] = {}
    if collector is not None:
        env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector}
    server_env = {**env, "REGIONBUS_TRACING_ENABLED": str(traced).lower()}
    label = "on" if traced else "off"
    with _environment(env), ExitStack() as stack:
        log_path = work_dir / f"server-tracing-{label}-{round_}.log"
        services = server_services(stack, local, namespace, options, log_path, server_env)
        tracing: dict[str, Any] = _TRACED if traced else {}
        writer_cache = ClientCache(
            ClientSettings(
                **services.client_settings(options, subscription_enabled=False, **tracing)
            )
        )
        try:
            writer = writer_cache.create_region(REGION, serializer=BytesSerializer())
            return regionbus_throughput(services, options, writer, tracing)
        finally:
            writer_cache.close()


def tracing_overhead(
    local: LocalStack, options: BenchOptions, console: Console, work_dir: Path
) -> TracingFigures:
    """(t) Run phase (a) :data:`ROUNDS` times with tracing off, then on, alternating.

    Raises:
        BenchError: a child process failed or did not answer in time.
    """
    off: list[Throughput] = []
    on: list[Throughput] = []
    with _collector() as endpoint:
        for round_ in range(ROUNDS):
            # Off first in even rounds, on first in odd ones: a drift of the machine
            # through the run (a broker with more topics each run) weighs on both.
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for traced in order:
                state = f"on at {SAMPLE_RATIO:.0%}" if traced else "off"
                progress.phase(
                    console,
                    f"(t) tracing {state}, round {round_ + 1} of {ROUNDS}: "
                    f"{options.ops:,} puts ...",
                )
                collector = endpoint if traced else None
                (on if traced else off).append(
                    _one_run(local, options, work_dir, collector, round_)
                )
    log.info("the collector took %d exports", _Collector.exports)
    return TracingFigures(off, on)


def print_tracing(figures: TracingFigures, console: Console) -> None:
    """Print (t): ops/s and CPU per op with tracing off and on, and the overheads."""
    table = Table(title=f"(t) tracing off and on at {SAMPLE_RATIO:.0%} sampling (phase (a))")
    for column in ("figure", "off", "on", "on ÷ off"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    table.add_row(
        "ops applied/s, each round",
        " ".join(f"{t.acked_per_s:,.0f}" for t in figures.off),
        " ".join(f"{t.acked_per_s:,.0f}" for t in figures.on),
        "",
    )
    table.add_row(
        "CPU µs per op: all, each round",
        " ".join(f"{_cpu_all(t):,.0f}" for t in figures.off),
        " ".join(f"{_cpu_all(t):,.0f}" for t in figures.on),
        "",
    )
    ops_off, ops_on = figures.ops_per_s(False), figures.ops_per_s(True)
    table.add_row(
        "ops applied/s, median", f"{ops_off:,.0f}", f"{ops_on:,.0f}", f"{ops_on / ops_off:.3f}x"
    )
    for process in (*_PROCESSES, "all"):
        off, on = figures.cpu_us(False, process), figures.cpu_us(True, process)
        table.add_row(
            f"CPU µs per op: {process}, median", f"{off:,.0f}", f"{on:,.0f}", f"{on / off:.3f}x"
        )
    for name, value in (("throughput", figures.overhead), ("CPU per op", figures.cpu_overhead)):
        met = "yes" if value <= OVERHEAD_TARGET else "NO"
        table.add_row(
            f"overhead: {name}", "", f"{value:+.1%}", f"target ≤ {OVERHEAD_TARGET:.0%}: {met}"
        )
    console.print(table)


def tracing_rows(figures: TracingFigures) -> list[SummaryRow]:
    """(t)'s rows for ``bench.all``'s table."""
    return [
        SummaryRow(
            "core",
            f"ops applied/s, tracing on at {SAMPLE_RATIO:.0%}",
            figures.ops_per_s(True),
            figures.ops_per_s(False),
            "tracing off, same run",
        ),
        SummaryRow(
            "core",
            f"CPU µs per op (writer, server, subscribers), tracing on at {SAMPLE_RATIO:.0%}",
            figures.cpu_us(True, "all"),
            figures.cpu_us(False, "all"),
            "tracing off, same run",
            higher_is_better=False,
        ),
    ]


__all__ = ["TracingFigures", "print_tracing", "tracing_overhead", "tracing_rows"]
