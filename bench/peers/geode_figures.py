"""Reading the Geode harness's answer and turning it into ``bench.all`` rows (pure logic).

The harness (``io.regionbus.peers.geode.GeodePeer run``) prints one JSON object on the last
line of its stdout; :func:`parse` reads it into :class:`GeodeFigures`, and
:func:`summary_rows` makes the rows whose baseline is Geode, each naming the row of
``bench.core`` or ``bench.failover`` whose regionbus figure it compares.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from bench.reads_figures import (
    UNMEASURED,
    ReadSeries,
    get_all_figure,
    parse_series,
    query_figure,
    series_rows,
)
from bench.summary import SummaryRow

CORE_VS_GEODE = "core vs Apache Geode"
FAILOVER_VS_GEODE = "failover vs Apache Geode"


@dataclass(frozen=True, slots=True)
class GeodeFailover:
    """The failover phase: two servers, subscription-redundancy 1, SIGKILL of the primary.

    Attributes:
        sent: Puts of distinct keys sent.
        acked: Puts that returned without an exception.
        put_errors: Puts that raised.
        acked_never_delivered: Acknowledged puts the listener never saw (Geode admits a
            small loss window on a primary's crash).
        duplicates: Events the listener saw a second time.
        kill_to_first_event_after_kill_ms: From the SIGKILL to the listener's first event of
            a put sent after it.
        longest_silence_after_kill_ms: Longest time without any event after the kill.
        longest_put_after_kill_ms: Longest single put call after the kill (the writer's
            stall).
        p99_before_kill_ms: put → listener p99 of puts sent before the kill.
        max_latency_after_kill_ms: Largest put → listener latency of a put sent after it.
    """

    sent: int
    acked: int
    put_errors: int
    acked_never_delivered: int
    duplicates: int
    kill_to_first_event_after_kill_ms: float
    longest_silence_after_kill_ms: float
    longest_put_after_kill_ms: float
    p99_before_kill_ms: float
    max_latency_after_kill_ms: float


@dataclass(frozen=True, slots=True)
class GeodeReads:
    """The read phases (``--reads true``): ``Region.getAll`` and a one-shot OQL query, the
    workload of :mod:`bench.reads_figures`.

    Attributes:
        entries: Entries pre-filled in each region.
        keys_per_call: Keys of one ``getAll``.
        get_all: ``getAll`` calls on a ``PROXY`` client region.
        query: ``QueryService.newQuery(QUERY_OQL).execute(QUERY_MIN_PRICE)`` runs.
        load_average: The machine's 1, 5 and 15 minute load averages before the phases,
            as text (``"?"`` when unknown).
    """

    entries: int
    keys_per_call: int
    get_all: ReadSeries
    query: ReadSeries
    load_average: str = "?"


@dataclass(frozen=True, slots=True)
class GeodeFigures:
    """What one harness run measured (see ``bench/peers/geode/``).

    Attributes:
        version: Geode's version, e.g. ``"1.15.1"``.
        puts_per_s: Acknowledged puts ÷ first put to last answer.
        events_per_s: Events seen by every subscriber ÷ first put to last delivery.
        subscribers: Subscriber client caches (one JVM each) in the throughput phase.
        writer_threads: Threads doing synchronous puts.
        acked: Acknowledged puts in the throughput phase.
        complete: Every subscriber saw every acknowledged put.
        p50_ms: put → listener latency, median, in ms (paced puts, after the warm-up).
        p99_ms: The same, 99th percentile.
        max_ms: The same, largest.
        latency_samples: Puts counted in the latency figures (0 when the latency phase
            did not run; its figures are then NaN).
        failover: The failover phase, when it ran.
        server_cpu_us_per_put: The cache server's user + system CPU microseconds per
            acknowledged put of the throughput phase, until every subscriber had them
            (fan-out to every subscriber included); NaN when the harness could not read it.
        server_rss_bytes: The cache server's resident set size after the throughput phase.
        subscriber_rss_max_bytes: The largest resident set size of a subscriber JVM after
            the throughput phase (what a subscriber costs in memory).
        reads: The read phases, when they ran.
    """

    version: str
    puts_per_s: float
    events_per_s: float
    subscribers: int
    writer_threads: int
    acked: int
    complete: bool
    p50_ms: float
    p99_ms: float
    max_ms: float
    latency_samples: int
    failover: GeodeFailover | None
    server_cpu_us_per_put: float = math.nan
    server_rss_bytes: float = math.nan
    subscriber_rss_max_bytes: float = math.nan
    reads: GeodeReads | None = None


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _bytes(value: Any) -> float:
    """A size the harness reports as -1 when it could not read it: NaN then."""
    return math.nan if value is None or float(value) < 0 else float(value)


def parse(stdout: str) -> GeodeFigures:
    """The figures from the harness's stdout (its last line that is a JSON object).

    Args:
        stdout: Everything the harness printed on stdout.

    Raises:
        ValueError: no line is a JSON object, or it lacks a figure.
    """
    lines = [line for line in stdout.splitlines() if line.lstrip().startswith("{")]
    if not lines:
        raise ValueError(f"the Geode harness printed no figures: {stdout[-500:]!r}")
    try:
        answer = json.loads(lines[-1])
        throughput = answer["throughput"]
        # Absent when the harness ran with --latency false (bench.scaling's Geode points).
        latency = answer.get("latency", {"latency_samples": 0})
        failover = answer.get("failover")
        reads = answer.get("reads")
        return GeodeFigures(
            version=str(answer["geode_version"]),
            puts_per_s=_float(throughput["puts_per_s"]),
            events_per_s=_float(throughput["events_per_s"]),
            subscribers=int(throughput["subscribers"]),
            writer_threads=int(throughput["writer_threads"]),
            acked=int(throughput["acked"]),
            complete=bool(throughput["complete"]),
            p50_ms=_float(latency.get("p50_ms")),
            p99_ms=_float(latency.get("p99_ms")),
            max_ms=_float(latency.get("max_ms")),
            latency_samples=int(latency["latency_samples"]),
            server_cpu_us_per_put=_float(throughput.get("server_cpu_us_per_put")),
            server_rss_bytes=_bytes(throughput.get("server_rss_bytes")),
            subscriber_rss_max_bytes=_bytes(throughput.get("subscriber_rss_max_bytes")),
            reads=None
            if reads is None
            else GeodeReads(
                entries=int(reads["entries"]),
                keys_per_call=int(reads["keys_per_call"]),
                get_all=parse_series(reads["get_all"]),
                query=parse_series(reads["query"]),
                load_average=str(reads.get("load_average", "?")),
            ),
            failover=None
            if failover is None
            else GeodeFailover(
                sent=int(failover["sent"]),
                acked=int(failover["acked"]),
                put_errors=int(failover["put_errors"]),
                acked_never_delivered=int(failover["acked_never_delivered"]),
                duplicates=int(failover["duplicates"]),
                kill_to_first_event_after_kill_ms=_float(
                    failover["kill_to_first_event_after_kill_ms"]
                ),
                longest_silence_after_kill_ms=_float(failover["longest_silence_after_kill_ms"]),
                longest_put_after_kill_ms=_float(failover["longest_put_after_kill_ms"]),
                p99_before_kill_ms=_float(failover["p99_before_kill_ms"]),
                max_latency_after_kill_ms=_float(failover["max_latency_after_kill_ms"]),
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the Geode harness's figures are not as expected: {exc!r}") from exc


def summary_rows(figures: GeodeFigures) -> list[SummaryRow]:
    """Rows whose baseline is Geode; regionbus comes from ``bench.core`` / ``bench.failover``
    of the same ``bench.all`` run (:func:`bench.summary.with_peers`), by figure name."""
    geode = f"Geode {figures.version}"
    delivered = f"events delivered/s ({figures.subscribers} subscribers)"

    def core(figure: str, value: float, name: str, higher_is_better: bool = True) -> SummaryRow:
        return SummaryRow(
            CORE_VS_GEODE, figure, math.nan, value, name, higher_is_better, ("core", figure)
        )

    rows = [
        core(
            "ops applied/s",
            figures.puts_per_s,
            f"{geode} puts/s ({figures.writer_threads} writer threads)",
        ),
        core(delivered, figures.events_per_s, f"{geode} to {figures.subscribers} client caches"),
        core("put→listener latency p50 (ms)", figures.p50_ms, f"{geode} p50", False),
        core("put→listener latency p99 (ms)", figures.p99_ms, f"{geode} p99", False),
    ]
    reads = figures.reads
    if reads is not None:
        rows += [
            *series_rows(
                CORE_VS_GEODE,
                lambda what: get_all_figure(reads.keys_per_call, what),
                UNMEASURED,
                reads.get_all,
                f"{geode} Region.getAll, PROXY client region (load {reads.load_average})",
                "calls",
                regionbus_of="core",
            ),
            *series_rows(
                CORE_VS_GEODE,
                lambda what: query_figure(reads.entries, what),
                UNMEASURED,
                reads.query,
                f"{geode} QueryService.newQuery().execute(), PDX JSON (load {reads.load_average})",
                "queries",
                regionbus_of="core",
            ),
        ]
    failover = figures.failover
    if failover is not None:
        rows += [
            SummaryRow(
                FAILOVER_VS_GEODE,
                "kill → delivering puts sent after the kill (ms)",
                math.nan,
                failover.kill_to_first_event_after_kill_ms,
                f"{geode}, 2 servers, redundancy 1",
                False,
                ("failover", "kill → every orphaned bucket delivering (ms)"),
            ),
            SummaryRow(
                FAILOVER_VS_GEODE,
                "acknowledged puts lost / listener duplicates",
                math.nan,
                float(failover.acked_never_delivered + failover.duplicates),
                f"{geode} ({failover.acked_never_delivered} lost, "
                f"{failover.duplicates} duplicates)",
                False,
                ("failover", "acknowledged puts lost / listener duplicates"),
            ),
        ]
    return rows


__all__ = [
    "CORE_VS_GEODE",
    "FAILOVER_VS_GEODE",
    "GeodeFailover",
    "GeodeFigures",
    "GeodeReads",
    "parse",
    "summary_rows",
]
