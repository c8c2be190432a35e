"""The pure parts of ``bench.scaling``: one point's figures, the two series, the Markdown
table, ``bench.all``'s summary rows and the plot (matplotlib, Agg: no display needed), and
how subscribers are spread over child processes and their results joined.
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


def markdown_table(points: Iterable[PointFigures], fixed_subscribers: int) -> str:
    """Both series as Markdown: one table per series, each rate with its ratio to the raw
    baseline in brackets; the shape to read is down a column."""
    lines: list[str] = []
    titles = {
        "subscribers": f"### Subscribers ({DEFAULT_TOTAL_BUCKETS} buckets)",
        "buckets": f"### Buckets ({fixed_subscribers} subscribers)",
    }
    for name, members in series(points, fixed_subscribers).items():
        if not members:
            continue
        lines += [
            titles[name],
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "|" + "---:|" * (len(COLUMNS) - 1) + "---|",
            *("| " + " | ".join(cells(p)) + " |" for p in members),
            "",
        ]
    return "\n".join(lines)


def summary_rows(points: Iterable[PointFigures]) -> list[SummaryRow]:
    """``bench.all``'s rows: ops/s, events/s and p99 of every point beside its baseline."""
    rows = []
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
    return rows


def plot(points: Iterable[PointFigures], fixed_subscribers: int, path: Path) -> Path:
    """Write a PNG of both series: rates (log scale) and latencies against subscribers
    and against buckets, raw baselines dashed.

    Args:
        points: The figures.
        fixed_subscribers: The subscriber count of the bucket series.
        path: Where the PNG goes (its folder must exist).

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_series = series(points, fixed_subscribers)
    figure, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    for column, (name, members) in enumerate(by_series.items()):
        xs = [p.subscribers if name == "subscribers" else p.buckets for p in members]
        rates, latencies = axes[0][column], axes[1][column]
        rates.plot(xs, [p.ops_per_s for p in members], "o-", label="ops applied/s")
        rates.plot(xs, [p.delivered_per_s for p in members], "s-", label="events delivered/s")
        rates.plot(xs, [p.raw_ops_per_s for p in members], "o--", label="raw produce→consume")
        rates.plot(
            xs, [p.raw_delivered_per_s for p in members], "s--", label="raw produce→N consumers"
        )
        latencies.plot(xs, [p.p50_ms for p in members], "o-", label="put→listener p50")
        latencies.plot(xs, [p.p99_ms for p in members], "s-", label="put→listener p99")
        latencies.plot(xs, [p.raw_p50_ms for p in members], "o--", label="raw relay p50")
        latencies.plot(xs, [p.raw_p99_ms for p in members], "s--", label="raw relay p99")
        label = (
            f"subscribers ({DEFAULT_TOTAL_BUCKETS} buckets)"
            if name == "subscribers"
            else f"buckets ({fixed_subscribers} subscribers)"
        )
        for axis, unit in ((rates, "per second"), (latencies, "milliseconds")):
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_xlabel(label)
            axis.set_ylabel(unit)
            axis.set_xticks(xs, [str(x) for x in xs])
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize="small")
    figure.suptitle("regionbus scaling (dashed: raw Kafka, same run)")
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
    "PointFigures",
    "cells",
    "markdown_table",
    "merge_results",
    "plot",
    "process_sizes",
    "series",
    "summary_rows",
]
