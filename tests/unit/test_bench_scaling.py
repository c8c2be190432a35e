"""The scaling benchmark's pure parts: series, Markdown table, summary rows, plot, and how
subscribers are spread over processes and their results joined."""

from __future__ import annotations

import math
from pathlib import Path

from bench.scaling_figures import (
    COLUMNS,
    REGISTERED_COLUMNS,
    PointFigures,
    RegisteredPoint,
    markdown_table,
    merge_results,
    plot,
    plot_lines,
    process_sizes,
    registered_cells,
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


_REGISTERED = [
    RegisteredPoint(1_000, 92.0, 57.5, 10.0, 90.7, (1.4, 1.2, 1.2)),
    RegisteredPoint(1, 73.0, 168.0, 8.0, 71.7, (0.7, 0.9, 1.1)),
    RegisteredPoint(10, 85.0, math.nan, 8.0, 83.8, (0.8, 0.9, 1.1)),
]


def test_the_registered_series_is_a_line_on_the_subscriber_cpu_panel_past_the_live_counts() -> None:
    panels = plot_lines(_RUN, 10, registered=_REGISTERED)
    (line,) = [x for x in panels[("subscribers", "cpu")] if "registered" in x.label]
    assert (line.xs, line.ys) == ([1, 10, 1_000], [73.0, 85.0, 92.0])
    assert line.style.endswith("-"), "regionbus's own lines are solid"
    assert not any("registered" in x.label for x in panels[("buckets", "cpu")])
    assert not any("registered" in x.label for x in plot_lines(_RUN, 10)[("subscribers", "cpu")])


def test_the_registered_table_gives_the_ratio_to_the_first_count_and_the_live_figure() -> None:
    one, ten, thousand = registered_cells(_RUN, _REGISTERED)
    assert one == ["1", "73.0", "1.00x", "120", "168", "8.0", "71.7", "0.7 0.9 1.1"]
    assert ten[:5] == ["10", "85.0", "1.16x", "120", "n/a"]
    assert thousand[:4] == ["1,000", "92.0", "1.26x", "n/a"]
    lines = markdown_table(_RUN, 10, registered=_REGISTERED).splitlines()
    header = "| " + " | ".join(REGISTERED_COLUMNS) + " |"
    assert lines.count(header) == 1
    assert lines[lines.index(header) + 4].startswith("| 1,000 | 92.0 | 1.26x |")
    assert header not in markdown_table(_RUN, 10).splitlines()


def test_summary_rows_put_each_registered_count_beside_the_first() -> None:
    rows = [r for r in summary_rows(_RUN, registered=_REGISTERED) if "registered" in r.figure]
    assert [(r.figure, r.regionbus, r.baseline) for r in rows] == [
        ("server CPU µs per put (1 subscribers registered and away)", 73.0, 73.0),
        ("server CPU µs per put (10 subscribers registered and away)", 85.0, 73.0),
        ("server CPU µs per put (1,000 subscribers registered and away)", 92.0, 73.0),
    ]
    assert all(not r.higher_is_better and r.baseline_name == "the same at 1" for r in rows)


def test_the_plot_with_the_registered_series_is_a_png(tmp_path: Path) -> None:
    path = plot(_RUN, 10, tmp_path / "scaling.png", registered=_REGISTERED)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
