"""The pure parts of ``bench.scaling``: one point's figures, the two series, Apache Geode's
points beside the subscriber series, the Markdown tables, ``bench.all``'s summary rows and
the plot (matplotlib, Agg: no display needed), and how subscribers are spread over child
processes and their results joined.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.summary import SummaryRow
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS


@dataclass(frozen=True, slots=True)
class PointFigures:
    """What one point measured, beside its raw Kafka baselines (NaN when not measured).

    Attributes:
        subscribers: Subscriber clients, each with ``ALL_KEYS`` interest.
        buckets: The server's bucket count.
        ops_per_s: Puts acknowledged per second (throughput phase).
        delivered_per_s: Events received per second, summed over the subscribers.
        complete: Every subscriber got every acknowledged put.
        p50_ms: Median put → listener latency over every subscriber, in milliseconds.
        p99_ms: Its 99th percentile, in milliseconds.
        raw_ops_per_s: Raw produce → 1 consumer messages per second.
        raw_delivered_per_s: Raw produce → ``subscribers`` consumers messages per second.
        raw_p50_ms: Raw two-hop relay latency median, in milliseconds.
        raw_p99_ms: Its 99th percentile, in milliseconds.
        server_cpu_us_per_op: The cache server's CPU microseconds per put of the
            throughput phase (routing to every subscriber included): the cost of fan-out.
        kafka_cpu_us_per_op: Kafka's, when this run started it (else NaN).
        load_average: The 1, 5 and 15 minute load averages before the point.
    """

    subscribers: int
    buckets: int
    ops_per_s: float
    delivered_per_s: float
    complete: bool
    p50_ms: float
    p99_ms: float
    raw_ops_per_s: float = math.nan
    raw_delivered_per_s: float = math.nan
    raw_p50_ms: float = math.nan
    raw_p99_ms: float = math.nan
    server_cpu_us_per_op: float = math.nan
    kafka_cpu_us_per_op: float = math.nan
    load_average: tuple[float, float, float] = (math.nan, math.nan, math.nan)


@dataclass(frozen=True, slots=True)
class GeodePoint:
    """What the Apache Geode harness measured at one subscriber count
    (``bench.peers.geode_scaling``).

    Attributes:
        subscribers: Subscriber client caches (a JVM each), each with ``ALL_KEYS`` interest.
        version: Geode's version, e.g. ``"1.15.1"``.
        ops_per_s: Acknowledged puts per second (16 writer threads, synchronous puts).
        delivered_per_s: Events received per second, summed over the subscribers.
        complete: Every subscriber got every acknowledged put.
        server_cpu_us_per_op: The Geode cache server's CPU microseconds per put, until
            every subscriber had them (NaN when unknown).
        subscriber_rss_bytes: The largest resident size of a subscriber JVM, in bytes.
        load_average: The 1, 5 and 15 minute load averages before the harness ran.
    """

    subscribers: int
    version: str
    ops_per_s: float
    delivered_per_s: float
    complete: bool
    server_cpu_us_per_op: float
    subscriber_rss_bytes: float = math.nan
    load_average: tuple[float, float, float] = (math.nan, math.nan, math.nan)


@dataclass(frozen=True, slots=True)
class RegisteredPoint:
    """The cache server's CPU per put with ``subscribers`` durable clients registered with
    ``ALL_KEYS`` and away (``bench.fleet_fanout``): the server routes to a durable client
    the same whether it is connected or not, so this is fan-out past what fits on one
    machine as live caches.

    Attributes:
        subscribers: Durable clients registered with ``ALL_KEYS``, all away.
        server_cpu_us_per_op: The cache server's CPU microseconds per acknowledged put.
        kafka_cpu_us_per_op: Kafka's, when this run started it (else NaN).
        idle_server_ms_per_s: The server's CPU milliseconds per second without puts (what
            its registered clients cost it whatever is put).
        above_idle_us_per_op: The server's CPU microseconds per put above that.
        load_average: The 1, 5 and 15 minute load averages before the puts.
    """

    subscribers: int
    server_cpu_us_per_op: float
    kafka_cpu_us_per_op: float
    idle_server_ms_per_s: float
    above_idle_us_per_op: float
    load_average: tuple[float, float, float] = (math.nan, math.nan, math.nan)


# --- the pure parts: series, table, summary rows, plot ---------------------------------


def series(points: Iterable[PointFigures], fixed_subscribers: int) -> dict[str, list[PointFigures]]:
    """The two series of a run: ``"subscribers"`` (points at the default bucket count, by
    subscriber count) and ``"buckets"`` (points with ``fixed_subscribers``, by bucket
    count). A point at both (10 subscribers, 16 buckets) is in both."""
    points = list(points)
    return {
        "subscribers": sorted(
            (p for p in points if p.buckets == DEFAULT_TOTAL_BUCKETS), key=lambda p: p.subscribers
        ),
        "buckets": sorted(
            (p for p in points if p.subscribers == fixed_subscribers), key=lambda p: p.buckets
        ),
    }


def _ratio(value: float, baseline: float) -> str:
    if math.isnan(value) or math.isnan(baseline) or not baseline:
        return "n/a"
    return f"{value / baseline:.2f}x"


def _number(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


COLUMNS: tuple[str, ...] = (
    "subscribers",
    "buckets",
    "ops applied/s",
    "raw produce→consume msg/s",
    "events delivered/s",
    "raw produce→N consumers msg/s",
    "p50 ms",
    "p99 ms",
    "raw relay p50 / p99 ms",
    "server / Kafka CPU µs per put",
    "load avg before",
)


def cells(point: PointFigures) -> list[str]:
    """One row of the table: each rate with its ratio to the raw baseline in brackets."""
    return [
        str(point.subscribers),
        str(point.buckets),
        f"{_number(point.ops_per_s)} ({_ratio(point.ops_per_s, point.raw_ops_per_s)})",
        _number(point.raw_ops_per_s),
        f"{_number(point.delivered_per_s)}"
        f" ({_ratio(point.delivered_per_s, point.raw_delivered_per_s)})"
        + ("" if point.complete else " incomplete"),
        _number(point.raw_delivered_per_s),
        _number(point.p50_ms),
        _number(point.p99_ms),
        f"{_number(point.raw_p50_ms)} / {_number(point.raw_p99_ms)}",
        f"{_number(point.server_cpu_us_per_op)} / {_number(point.kafka_cpu_us_per_op)}",
        " ".join(f"{x:.1f}" for x in point.load_average),
    ]


GEODE_COLUMNS: tuple[str, ...] = (
    "subscribers",
    "server CPU µs per put: regionbus / Geode",
    "regionbus ÷ Geode",
    "ops applied/s: regionbus / Geode",
    "events delivered/s: regionbus / Geode",
    "Geode subscriber JVM MiB",
    "load avg before: regionbus / Geode",
)


def geode_cells(points: Iterable[PointFigures], geode: Iterable[GeodePoint]) -> list[list[str]]:
    """The rows of the regionbus-beside-Geode table: one per subscriber count of either
    (regionbus's subscriber series, Geode's points), by count; a side that did not run at
    a count reads ``n/a``.

    Args:
        points: regionbus's points (only those at the default bucket count are used).
        geode: Geode's points.
    """
    ours = {p.subscribers: p for p in points if p.buckets == DEFAULT_TOTAL_BUCKETS}
    theirs = {g.subscribers: g for g in geode}
    nan3 = (math.nan, math.nan, math.nan)
    rows = []
    for count in sorted(ours.keys() | theirs.keys()):
        p, g = ours.get(count), theirs.get(count)
        ours_cpu = p.server_cpu_us_per_op if p else math.nan
        theirs_cpu = g.server_cpu_us_per_op if g else math.nan
        rss = g.subscriber_rss_bytes / (1024 * 1024) if g else math.nan
        rows.append(
            [
                str(count),
                f"{_number(ours_cpu)} / {_number(theirs_cpu)}",
                _ratio(ours_cpu, theirs_cpu),
                f"{_number(p.ops_per_s if p else math.nan)}"
                f" / {_number(g.ops_per_s if g else math.nan)}",
                f"{_number(p.delivered_per_s if p else math.nan)}"
                + ("" if p is None or p.complete else " incomplete")
                + f" / {_number(g.delivered_per_s if g else math.nan)}"
                + ("" if g is None or g.complete else " incomplete"),
                _number(rss),
                f"{_load(p.load_average if p else nan3)} / {_load(g.load_average if g else nan3)}",
            ]
        )
    return rows


def _load(load_average: tuple[float, float, float]) -> str:
    if all(math.isnan(x) for x in load_average):
        return "n/a"
    return " ".join(f"{x:.1f}" for x in load_average)


def geode_title(geode: Sequence[GeodePoint]) -> str:
    """The title of the regionbus-beside-Geode table, naming Geode's version."""
    version = geode[0].version if geode else "n/a"
    return (
        f"Subscribers sharing ALL_KEYS: regionbus ({DEFAULT_TOTAL_BUCKETS} buckets) beside "
        f"Apache Geode {version} (one cache server, a JVM per subscriber)"
    )


REGISTERED_TITLE = (
    f"Subscribers registered with ALL_KEYS and away ({DEFAULT_TOTAL_BUCKETS} buckets): "
    "the server's CPU per put"
)

REGISTERED_COLUMNS: tuple[str, ...] = (
    "subscribers",
    "server CPU µs per put",
    "÷ at the first count",
    "live subscribers' server CPU µs per put",
    "Kafka CPU µs per put",
    "server CPU without puts ms/s",
    "server CPU µs per put above that",
    "load avg before",
)


def registered_cells(
    points: Iterable[PointFigures], registered: Sequence[RegisteredPoint]
) -> list[list[str]]:
    """The rows of the registered subscribers' table, by count: each server CPU per put
    with its ratio to the first count's, and the live subscriber series' figure at the
    same count (``n/a`` where it has none)."""
    live = {p.subscribers: p for p in points if p.buckets == DEFAULT_TOTAL_BUCKETS}
    ordered = sorted(registered, key=lambda r: r.subscribers)
    first = ordered[0].server_cpu_us_per_op if ordered else math.nan
    return [
        [
            f"{r.subscribers:,}",
            _number(r.server_cpu_us_per_op),
            _ratio(r.server_cpu_us_per_op, first),
            _number(
                live[r.subscribers].server_cpu_us_per_op if r.subscribers in live else math.nan
            ),
            _number(r.kafka_cpu_us_per_op),
            _number(r.idle_server_ms_per_s),
            _number(r.above_idle_us_per_op),
            _load(r.load_average),
        ]
        for r in ordered
    ]


def markdown_table(
    points: Iterable[PointFigures],
    fixed_subscribers: int,
    geode: Sequence[GeodePoint] = (),
    registered: Sequence[RegisteredPoint] = (),
) -> str:
    """Both series as Markdown: one table per series, each rate with its ratio to the raw
    baseline in brackets; the shape to read is down a column. With Geode's points, a third
    table puts them beside the subscriber series (:func:`geode_cells`); with the registered
    subscribers' points, a last one (:func:`registered_cells`)."""
    points = list(points)
    lines: list[str] = []
    titles = {
        "subscribers": f"### Subscribers ({DEFAULT_TOTAL_BUCKETS} buckets)",
        "buckets": f"### Buckets ({fixed_subscribers} subscribers)",
    }
    for name, members in series(points, fixed_subscribers).items():
        if members:
            lines += _markdown_section(titles[name], COLUMNS, [cells(p) for p in members])
    if geode:
        lines += _markdown_section(
            f"### {geode_title(geode)}", GEODE_COLUMNS, geode_cells(points, geode)
        )
    if registered:
        lines += _markdown_section(
            f"### {REGISTERED_TITLE}", REGISTERED_COLUMNS, registered_cells(points, registered)
        )
    return "\n".join(lines)


def _markdown_section(title: str, columns: Sequence[str], rows: Iterable[list[str]]) -> list[str]:
    """A titled Markdown table: numbers right-aligned, the last column (the load) left."""
    return [
        title,
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---:|" * (len(columns) - 1) + "---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


SCALING_VS_GEODE = "scaling vs Apache Geode"


def summary_rows(
    points: Iterable[PointFigures],
    geode: Iterable[GeodePoint] = (),
    registered: Sequence[RegisteredPoint] = (),
) -> list[SummaryRow]:
    """``bench.all``'s rows: ops/s, events/s and p99 of every point beside its baseline;
    the server CPU per put of every Geode point beside regionbus's at its count (NaN
    where regionbus's subscriber series has no such count); and the server CPU per put at
    every registered count beside the first count's."""
    points = list(points)
    ours = {p.subscribers: p for p in points if p.buckets == DEFAULT_TOTAL_BUCKETS}
    rows: list[SummaryRow] = []
    for p in points:
        at = f"{p.subscribers} subscribers, {p.buckets} buckets"
        rows += [
            SummaryRow(
                "scaling", f"ops applied/s ({at})", p.ops_per_s, p.raw_ops_per_s,
                "produce→consume msg/s",
            ),
            SummaryRow(
                "scaling", f"events delivered/s ({at})", p.delivered_per_s,
                p.raw_delivered_per_s, f"produce→{p.subscribers} consumers msg/s",
            ),
            SummaryRow(
                "scaling", f"put→listener p99 ms ({at})", p.p99_ms, p.raw_p99_ms,
                "two-hop relay p99", higher_is_better=False,
            ),
            SummaryRow(
                "scaling", f"server CPU µs per put ({at})", p.server_cpu_us_per_op,
                p.kafka_cpu_us_per_op, "Kafka CPU µs per put", higher_is_better=False,
            ),
        ]  # fmt: skip
    rows += [
        SummaryRow(
            SCALING_VS_GEODE,
            f"server CPU µs per put ({g.subscribers} subscribers)",
            ours[g.subscribers].server_cpu_us_per_op if g.subscribers in ours else math.nan,
            g.server_cpu_us_per_op,
            f"Geode {g.version} server CPU µs per put",
            higher_is_better=False,
        )
        for g in geode
    ]
    ordered = sorted(registered, key=lambda r: r.subscribers)
    rows += [
        SummaryRow(
            "scaling",
            f"server CPU µs per put ({r.subscribers:,} subscribers registered and away)",
            r.server_cpu_us_per_op,
            ordered[0].server_cpu_us_per_op,
            f"the same at {ordered[0].subscribers:,}",
            higher_is_better=False,
        )
        for r in ordered
    ]
    return rows


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a panel of the plot: ``style`` is matplotlib's format string (solid:
    regionbus, dashed: raw Kafka, dotted: Apache Geode)."""

    label: str
    xs: list[int]
    ys: list[float]
    style: str


PANELS: tuple[tuple[str, str], ...] = (
    ("rates", "per second"),
    ("latencies", "milliseconds"),
    ("cpu", "CPU µs per put"),
)
"""The rows of the plot: its panels' names and y units."""


def plot_lines(
    points: Iterable[PointFigures],
    fixed_subscribers: int,
    geode: Sequence[GeodePoint] = (),
    registered: Sequence[RegisteredPoint] = (),
) -> dict[tuple[str, str], list[Line]]:
    """The lines of every panel, by ``(series, panel)``: series ``"subscribers"`` /
    ``"buckets"``, panel one of :data:`PANELS`. Geode's points (by subscriber count) are on
    the subscriber series' rates and CPU panels, the registered subscribers' on its CPU
    panel."""
    panels: dict[tuple[str, str], list[Line]] = {}
    for name, members in series(points, fixed_subscribers).items():
        xs = [p.subscribers if name == "subscribers" else p.buckets for p in members]

        def line(label: str, ys: list[float], style: str, xs: list[int] = xs) -> Line:
            return Line(label, xs, ys, style)

        panels[(name, "rates")] = [
            line("ops applied/s", [p.ops_per_s for p in members], "o-"),
            line("events delivered/s", [p.delivered_per_s for p in members], "s-"),
            line("raw produce→consume", [p.raw_ops_per_s for p in members], "o--"),
            line("raw produce→N consumers", [p.raw_delivered_per_s for p in members], "s--"),
        ]
        panels[(name, "latencies")] = [
            line("put→listener p50", [p.p50_ms for p in members], "o-"),
            line("put→listener p99", [p.p99_ms for p in members], "s-"),
            line("raw relay p50", [p.raw_p50_ms for p in members], "o--"),
            line("raw relay p99", [p.raw_p99_ms for p in members], "s--"),
        ]
        panels[(name, "cpu")] = [
            line("regionbus server", [p.server_cpu_us_per_op for p in members], "o-"),
            line("Kafka broker", [p.kafka_cpu_us_per_op for p in members], "s-"),
        ]
    if geode:
        ordered = sorted(geode, key=lambda g: g.subscribers)
        counts = [g.subscribers for g in ordered]
        name = f"Geode {ordered[0].version}"
        panels[("subscribers", "rates")] += [
            Line(f"{name} puts/s", counts, [g.ops_per_s for g in ordered], "o:"),
            Line(f"{name} events/s", counts, [g.delivered_per_s for g in ordered], "s:"),
        ]
        panels[("subscribers", "cpu")].append(
            Line(f"{name} server", counts, [g.server_cpu_us_per_op for g in ordered], "^:")
        )
    if registered:
        steps = sorted(registered, key=lambda r: r.subscribers)
        panels.setdefault(("subscribers", "cpu"), []).append(
            Line(
                "regionbus server, subscribers registered and away",
                [r.subscribers for r in steps],
                [r.server_cpu_us_per_op for r in steps],
                "D-",
            )
        )
    return panels


def plot(
    points: Iterable[PointFigures],
    fixed_subscribers: int,
    path: Path,
    geode: Sequence[GeodePoint] = (),
    registered: Sequence[RegisteredPoint] = (),
) -> Path:
    """Write a PNG of both series: rates, latencies and the server's CPU per put (log
    scales) against subscribers and against buckets; raw baselines dashed, Apache Geode
    dotted (:func:`plot_lines`).

    Args:
        points: The figures.
        fixed_subscribers: The subscriber count of the bucket series.
        path: Where the PNG goes (its folder must exist).
        geode: Apache Geode's points, beside the subscriber series.
        registered: The registered subscribers' points, on the subscriber series' CPU
            panel.

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = plot_lines(points, fixed_subscribers, geode, registered)
    figure, axes = plt.subplots(len(PANELS), 2, figsize=(11, 11), constrained_layout=True)
    for column, name in enumerate(("subscribers", "buckets")):
        label = (
            f"subscribers ({DEFAULT_TOTAL_BUCKETS} buckets)"
            if name == "subscribers"
            else f"buckets ({fixed_subscribers} subscribers)"
        )
        for row, (panel, unit) in enumerate(PANELS):
            axis = axes[row][column]
            lines = panels[(name, panel)]
            for line in lines:
                axis.plot(line.xs, line.ys, line.style, label=line.label)
            ticks = sorted({x for line in lines for x in line.xs})
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_xlabel(label)
            axis.set_ylabel(unit)
            axis.set_xticks(ticks, [str(x) for x in ticks])
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize="small")
    figure.suptitle(
        "regionbus scaling (dashed: raw Kafka, dotted: Apache Geode, same run)"
        if geode
        else "regionbus scaling (dashed: raw Kafka, same run)"
    )
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def merge_results(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One reader result (``bench.workers``' shape) from those of several children: the
    per-reader lists joined, CPU seconds summed, the status ``complete`` only when every
    child's was."""
    statuses = {r["status"] for r in results}
    return {
        "status": "complete" if statuses <= {"complete"} else sorted(statuses - {"complete"})[0],
        "cpu_s": sum(float(r["cpu_s"]) for r in results),
        **{
            key: [value for r in results for value in r[key]]
            for key in ("counts", "first_ns", "last_ns", "sent_ns", "received_ns")
        },
    }


def process_sizes(clients: int, per_process: int) -> list[int]:
    """Clients per child process: as few processes as hold ``per_process`` each, filled
    evenly (100 by 25: four of 25; 10 by 25: one of 10)."""
    processes = max(1, math.ceil(clients / per_process))
    base, extra = divmod(clients, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


__all__ = [
    "COLUMNS",
    "GEODE_COLUMNS",
    "PANELS",
    "REGISTERED_COLUMNS",
    "REGISTERED_TITLE",
    "SCALING_VS_GEODE",
    "GeodePoint",
    "Line",
    "PointFigures",
    "RegisteredPoint",
    "cells",
    "geode_cells",
    "geode_title",
    "markdown_table",
    "merge_results",
    "plot",
    "plot_lines",
    "process_sizes",
    "registered_cells",
    "series",
    "summary_rows",
]
