"""The read phases' workload, figures and ``bench.all`` rows (pure logic): ``get_all`` and a
one-shot OQL query, each beside raw Redis and, through :mod:`bench.peers.geode_figures`,
beside Apache Geode.

The workload is defined here once so that ``bench.core`` (:mod:`bench.reads`) and the Geode
harness (``bench/peers/geode/src/main/java/.../Reads.java``, which spells the same
constants) measure the same thing, and so that the rows of both pair by figure name:

- ``get_all``: a region pre-filled with ``entries`` keys ``ga-<i>`` and byte values of
  ``value_bytes``; ``calls`` calls of ``keys_per_call`` distinct random keys each, one at a
  time, after a tenth as many untimed (the servers' and the JVMs' warm-up);
- the query: region :data:`QUERY_REGION` pre-filled with ``entries`` JSON documents
  :func:`query_document` (keys ``q-<i>``); :data:`QUERY_OQL` with ``$1`` =
  :data:`QUERY_MIN_PRICE` selects a tenth of them; ``runs`` runs one at a time, after a
  tenth as many untimed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from bench.report import percentile
from bench.summary import SummaryRow

QUERY_REGION: Final = "bench_query"
"""The region of the query phase (a cache server of ``bench.core`` defines it)."""

QUERY_OQL: Final = f"SELECT * FROM /{QUERY_REGION} v WHERE v.price >= $1"
"""The one-shot query, in the OQL that regionbus and Geode both run."""

QUERY_MIN_PRICE: Final = 90.0
"""``$1`` of :data:`QUERY_OQL`: prices run 0.0 to 99.9, so a tenth of the entries qualify."""

GET_ALL_KEY_PREFIX: Final = "ga-"
QUERY_KEY_PREFIX: Final = "q-"


def query_document(index: int) -> dict[str, Any]:
    """The value of entry ``q-<index>`` of the query region (the Geode harness stores the
    same JSON as a PDX document): ``price`` runs 0.0 to 99.9, its whole part
    ``index % 100``, so a tenth of any hundred consecutive entries has 90 or more."""
    return {"id": index, "price": index % 100 + index // 100 % 10 / 10, "name": f"item-{index}"}


def selected_rows(entries: int) -> int:
    """How many of ``entries`` documents :data:`QUERY_OQL` selects."""
    return sum(1 for i in range(entries) if query_document(i)["price"] >= QUERY_MIN_PRICE)


def warmup_count(timed: int) -> int:
    """Untimed calls or runs before ``timed`` timed ones: a tenth, at least one."""
    return max(1, timed // 10)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The read phases' sizes (``python -m bench.core --help``).

    Attributes:
        entries: Entries pre-filled in each of the two regions.
        keys_per_call: Keys of one ``get_all`` call.
        calls: Timed ``get_all`` calls.
        query_runs: Timed runs of the query.
        value_bytes: Size of the ``get_all`` region's values.
    """

    entries: int = 10_000
    keys_per_call: int = 100
    calls: int = 500
    query_runs: int = 20
    value_bytes: int = 200


@dataclass(frozen=True, slots=True)
class ReadSeries:
    """Calls made one at a time: how many, their rate and latency.

    Attributes:
        calls: Timed calls.
        per_s: Calls ÷ wall time from the first timed call's start to the last one's end.
        p50_ms: Latency of one call, median, in ms.
        p99_ms: The same, 99th percentile (nearest rank).
        items: Values answered over every timed call (present values for ``get_all``,
            rows for the query): what the completeness checks read.
    """

    calls: int
    per_s: float
    p50_ms: float
    p99_ms: float
    items: int


UNMEASURED: Final = ReadSeries(0, math.nan, math.nan, math.nan, 0)
"""The regionbus side of a peer's rows, filled from ``bench.core``'s rows of the same run."""


def parse_series(answer: dict[str, Any]) -> ReadSeries:
    """A series as the Geode harness answers it (``calls``, ``per_s``, ``p50_ms``,
    ``p99_ms``, ``items``).

    Raises:
        KeyError: a figure is missing.
        TypeError, ValueError: a figure is not a number.
    """
    return ReadSeries(
        int(answer["calls"]),
        float(answer["per_s"]),
        float(answer["p50_ms"]),
        float(answer["p99_ms"]),
        int(answer["items"]),
    )


def timed_calls(calls: Sequence[Callable[[], int]], warmup: int) -> ReadSeries:
    """Run ``calls`` one after the other, the first ``warmup`` untimed; each returns how
    many items it got."""
    for call in calls[:warmup]:
        call()
    timed = calls[warmup:]
    latencies_ms: list[float] = []
    items = 0
    started = time.perf_counter()
    for call in timed:
        before = time.perf_counter()
        items += call()
        latencies_ms.append((time.perf_counter() - before) * 1000)
    elapsed_s = time.perf_counter() - started
    latencies_ms.sort()
    return ReadSeries(
        len(timed),
        len(timed) / elapsed_s if elapsed_s > 0 else math.nan,
        percentile(latencies_ms, 0.5),
        percentile(latencies_ms, 0.99),
        items,
    )


@dataclass(frozen=True, slots=True)
class ReadFigures:
    """The read phases of one ``bench.core`` run.

    Attributes:
        options: The sizes.
        get_all: regionbus ``get_all`` on a ``PROXY`` region.
        raw_get_all: raw Redis: the same keys' values read from the hashes the servers
            store them in (``HMGET`` per bucket, one pipeline: the ``MGET`` of this
            layout).
        query: regionbus ``query_service().new_query(QUERY_OQL).execute(QUERY_MIN_PRICE)``.
        raw_query: raw Redis: ``HSCAN`` of every bucket's values hash, each value decoded
            (JSON) and filtered in Python.
        rows: Rows one query selects.
        load_average: The machine's 1, 5 and 15 minute load averages before the phases.
    """

    options: ReadOptions
    get_all: ReadSeries
    raw_get_all: ReadSeries
    query: ReadSeries
    raw_query: ReadSeries
    rows: int
    load_average: tuple[float, float, float]


def get_all_figure(keys_per_call: int, what: str) -> str:
    """A ``get_all`` row's figure name, e.g. ``get_all of 100 keys, calls/s``."""
    return f"get_all of {keys_per_call} keys, {what}"


def query_figure(entries: int, what: str) -> str:
    """A query row's figure name, e.g. ``OQL query over 10,000 entries (a tenth
    selected), queries/s``."""
    return f"OQL query over {entries:,} entries (a tenth selected), {what}"


def series_rows(
    benchmark: str,
    figure: Callable[[str], str],
    ours: ReadSeries,
    baseline: ReadSeries,
    baseline_name: str,
    unit: str,
    regionbus_of: str | None = None,
) -> list[SummaryRow]:
    """Three rows, rate, p50 and p99, of one series beside its baseline's; with
    ``regionbus_of`` (a benchmark) the regionbus figures are taken from that benchmark's
    rows of the same names (:func:`bench.summary.with_peers`)."""
    rows = []
    for what, value, base, higher in (
        (f"{unit}/s", ours.per_s, baseline.per_s, True),
        ("p50 (ms)", ours.p50_ms, baseline.p50_ms, False),
        ("p99 (ms)", ours.p99_ms, baseline.p99_ms, False),
    ):
        name = figure(what)
        source = (regionbus_of, name) if regionbus_of else None
        rows.append(SummaryRow(benchmark, name, value, base, baseline_name, higher, source))
    return rows


def summary_rows(figures: ReadFigures) -> list[SummaryRow]:
    """``bench.core``'s rows of the read phases, each beside raw Redis of the same run."""
    options = figures.options
    load = " ".join(f"{x:.1f}" for x in figures.load_average)
    return [
        *series_rows(
            "core",
            lambda what: get_all_figure(options.keys_per_call, what),
            figures.get_all,
            figures.raw_get_all,
            f"raw Redis HMGET per bucket hash, one pipeline (load {load})",
            "calls",
        ),
        *series_rows(
            "core",
            lambda what: query_figure(options.entries, what),
            figures.query,
            figures.raw_query,
            f"raw Redis HSCAN + JSON filter in Python (load {load})",
            "queries",
        ),
    ]


__all__ = [
    "GET_ALL_KEY_PREFIX",
    "QUERY_KEY_PREFIX",
    "QUERY_MIN_PRICE",
    "QUERY_OQL",
    "QUERY_REGION",
    "UNMEASURED",
    "ReadFigures",
    "ReadOptions",
    "ReadSeries",
    "get_all_figure",
    "parse_series",
    "query_document",
    "query_figure",
    "selected_rows",
    "series_rows",
    "summary_rows",
    "timed_calls",
    "warmup_count",
]
