"""The scaling benchmark's pure parts: series, Markdown table, summary rows, plot, and how
subscribers are spread over processes and their results joined."""

from __future__ import annotations

import math
from pathlib import Path

from bench.scaling_figures import (
    COLUMNS,
    PointFigures,
    markdown_table,
    merge_results,
    plot,
    process_sizes,
    series,
    summary_rows,
)


def _point(subscribers: int, buckets: int, **overrides: object) -> PointFigures:
    fields: dict[str, object] = {
        "subscribers": subscribers,
        "buckets": buckets,
        "ops_per_s": 1_000.0 * buckets,
        "delivered_per_s": 1_000.0 * subscribers,
        "complete": True,
        "p50_ms": 5.0,
        "p99_ms": 50.0,
        "raw_ops_per_s": 2_000.0,
        "raw_delivered_per_s": 2_000.0 * subscribers,
        "raw_p50_ms": 2.0,
        "raw_p99_ms": 10.0,
        "server_cpu_us_per_op": 120.0,
        "kafka_cpu_us_per_op": 40.0,
        "load_average": (1.0, 2.0, 3.0),
        **overrides,
    }
    return PointFigures(**fields)  # type: ignore[arg-type]


_RUN = [_point(10, 64), _point(100, 16), _point(1, 16), _point(10, 16), _point(10, 1)]


def test_the_series_share_the_point_at_the_default_buckets_and_the_fixed_subscribers() -> None:
    by_series = series(_RUN, fixed_subscribers=10)
    assert [p.subscribers for p in by_series["subscribers"]] == [1, 10, 100]
    assert {p.buckets for p in by_series["subscribers"]} == {16}
    assert [p.buckets for p in by_series["buckets"]] == [1, 16, 64]
    assert {p.subscribers for p in by_series["buckets"]} == {10}


def test_the_markdown_table_has_a_table_per_series_with_ratios_and_the_load() -> None:
    table = markdown_table(_RUN, fixed_subscribers=10)
    lines = table.splitlines()
    assert "### Subscribers (16 buckets)" in lines and "### Buckets (10 subscribers)" in lines
    header = "| " + " | ".join(COLUMNS) + " |"
    assert lines.count(header) == 2
    rows = [line for line in lines if line.startswith("| 100 |")]
    assert rows == [
        "| 100 | 16 | 16,000 (8.00x) | 2,000 | 100,000 (0.50x) | 200,000 | 5.0 | 50.0 "
        "| 2.0 / 10.0 | 120 / 40.0 | 1.0 2.0 3.0 |"
    ]
    assert all(len(line.split("|")) == len(COLUMNS) + 2 for line in lines if line.startswith("|"))


def test_a_missing_baseline_reads_n_a_and_an_incomplete_point_says_so() -> None:
    point = _point(1, 16, raw_delivered_per_s=math.nan, complete=False)
    (row,) = [line for line in markdown_table([point], 10).splitlines() if line.startswith("| 1 ")]
    assert "1,000 (n/a) incomplete" in row


def test_summary_rows_name_the_point_and_read_the_latency_as_lower_is_better() -> None:
    rows = summary_rows([_point(100, 16)])
    assert [r.figure for r in rows] == [
        "ops applied/s (100 subscribers, 16 buckets)",
        "events delivered/s (100 subscribers, 16 buckets)",
        "put→listener p99 ms (100 subscribers, 16 buckets)",
        "server CPU µs per put (100 subscribers, 16 buckets)",
    ]
    assert {r.benchmark for r in rows} == {"scaling"}
    assert rows[1].ratio == 0.5
    assert rows[2].ratio == 5.0 and not rows[2].higher_is_better
    assert rows[3].ratio == 3.0 and not rows[3].higher_is_better


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    written = plot(_RUN, 10, tmp_path / "scaling.png")
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert written.stat().st_size > 10_000


def test_subscribers_are_spread_evenly_over_as_few_processes_as_hold_them() -> None:
    assert process_sizes(100, 25) == [25, 25, 25, 25]
    assert process_sizes(10, 25) == [10]
    assert process_sizes(26, 25) == [13, 13]
    assert process_sizes(7, 3) == [3, 2, 2]
    assert process_sizes(1, 1) == [1]


def test_children_results_join_per_reader_and_sum_cpu() -> None:
    first = {
        "status": "complete",
        "cpu_s": 1.5,
        "counts": [3, 3],
        "first_ns": [1, 2],
        "last_ns": [10, 11],
        "sent_ns": [1],
        "received_ns": [5],
    }
    second = {**first, "status": "idle", "cpu_s": 0.5, "counts": [2], "first_ns": [3]}
    second |= {"last_ns": [12], "sent_ns": [], "received_ns": []}
    merged = merge_results([first, second])
    assert merged["counts"] == [3, 3, 2]
    assert merged["last_ns"] == [10, 11, 12]
    assert merged["sent_ns"] == [1] and merged["received_ns"] == [5]
    assert merged["cpu_s"] == 2.0
    assert merged["status"] == "idle"
    assert merge_results([first, first])["status"] == "complete"
