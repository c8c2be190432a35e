"""Apache Geode beside bench.scaling's subscriber series, the pure parts: reading the
harness's server CPU per put, which subscriber counts fit in memory, the table beside
regionbus's, bench.all's rows and the plot's lines."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from bench import progress
from bench.peers import geode_scaling
from bench.peers.geode_figures import GeodeFigures, parse
from bench.peers.geode_scaling import (
    DEFAULT_COUNTS,
    FIXED_BYTES,
    GIB,
    MEMORY_BUDGET_BYTES,
    SUBSCRIBER_RSS_BYTES,
    counts_that_fit,
    geode_point,
    point_bytes,
)
from bench.peers.jvm import PeerSetupError
from bench.scaling import ScalingOptions, geode_points
from bench.scaling_figures import (
    COLUMNS,
    GEODE_COLUMNS,
    SCALING_VS_GEODE,
    GeodePoint,
    PointFigures,
    geode_cells,
    markdown_table,
    plot,
    plot_lines,
    summary_rows,
)

# As the harness prints it with --latency false --failover false: no latency object.
SCALING_ANSWER = {
    "peer": "Apache Geode",
    "geode_version": "1.15.1",
    "settings": {"ops": "2000"},
    "throughput": {
        "sent": 2000,
        "warmup_acked": 2000,
        "acked": 2000,
        "errors": 0,
        "writer_threads": 16,
        "puts_per_s": 3000.0,
        "subscribers": 10,
        "counts": [2000] * 10,
        "delivered": 20000,
        "events_per_s": 25000.0,
        "complete": True,
        "server_cpu_s": 1.07,
        "server_cpu_us_per_put": 535.0,
        "server_rss_bytes": 348303360,
        "subscriber_rss_max_bytes": 128888832,
    },
}


def _point(subscribers: int, buckets: int = 16, cpu_us: float = 100.0) -> PointFigures:
    return PointFigures(
        subscribers=subscribers,
        buckets=buckets,
        ops_per_s=5_000.0,
        delivered_per_s=5_000.0 * subscribers,
        complete=True,
        p50_ms=5.0,
        p99_ms=50.0,
        server_cpu_us_per_op=cpu_us,
        kafka_cpu_us_per_op=40.0,
        load_average=(1.0, 2.0, 3.0),
    )


def _geode(subscribers: int, cpu_us: float, complete: bool = True) -> GeodePoint:
    return GeodePoint(
        subscribers=subscribers,
        version="1.15.1",
        ops_per_s=3_000.0,
        delivered_per_s=3_000.0 * subscribers,
        complete=complete,
        server_cpu_us_per_op=cpu_us,
        subscriber_rss_bytes=128 * 1024 * 1024,
        load_average=(4.0, 5.0, 6.0),
    )


_RB = [_point(1), _point(10), _point(100), _point(10, buckets=64, cpu_us=999.0)]
_GEODE = [_geode(60, 2_000.0), _geode(1, 200.0), _geode(10, 500.0)]


def test_the_server_cpu_per_put_and_sizes_are_read_and_the_latency_phase_may_be_absent() -> None:
    figures = parse("geode-peer 1.0 s: ...\n" + json.dumps(SCALING_ANSWER))
    assert figures.server_cpu_us_per_put == 535.0
    assert figures.server_rss_bytes == 348303360.0
    assert figures.subscriber_rss_max_bytes == 128888832.0
    assert (figures.subscribers, figures.puts_per_s, figures.events_per_s) == (10, 3000.0, 25000.0)
    assert figures.latency_samples == 0 and math.isnan(figures.p99_ms)
    point = geode_point(figures, (1.5, 2.5, 3.5))
    assert (point.subscribers, point.server_cpu_us_per_op, point.version) == (10, 535.0, "1.15.1")
    assert point.subscriber_rss_bytes == 128888832.0 and point.load_average == (1.5, 2.5, 3.5)


def test_a_size_the_harness_could_not_read_and_an_older_answer_read_as_not_available() -> None:
    answer = json.loads(json.dumps(SCALING_ANSWER))
    answer["throughput"]["subscriber_rss_max_bytes"] = -1
    del answer["throughput"]["server_cpu_us_per_put"]
    figures = parse(json.dumps(answer))
    assert math.isnan(figures.subscriber_rss_max_bytes)
    assert math.isnan(figures.server_cpu_us_per_put)


def test_counts_fit_the_budget_and_the_memory_available_now() -> None:
    assert point_bytes(10) == FIXED_BYTES + 10 * SUBSCRIBER_RSS_BYTES
    # The defaults fit the budget on their own: the help text's reasoning holds.
    assert counts_that_fit(DEFAULT_COUNTS, None) == (list(DEFAULT_COUNTS), [])
    most = (MEMORY_BUDGET_BYTES - FIXED_BYTES) // SUBSCRIBER_RSS_BYTES
    assert counts_that_fit([most, most + 1], None) == ([most], [most + 1])
    # 4 GiB available: 80 % of it is 3.2 GiB, 2 GiB of which the server and writer take.
    assert counts_that_fit([1, 7, 8, 60], 4 * GIB) == ([1, 7], [8, 60])
    assert counts_that_fit([1, 10], 100 * GIB) == ([1, 10], [])


def test_the_geode_table_puts_each_count_of_either_side_beside_the_other() -> None:
    rows = geode_cells(_RB, _GEODE)
    assert [row[0] for row in rows] == ["1", "10", "60", "100"]
    assert all(len(row) == len(GEODE_COLUMNS) for row in rows)
    one, ten, sixty, hundred = rows
    assert one[1:3] == ["100 / 200", "0.50x"]
    # The 64-bucket point is the bucket series', not the subscriber series'.
    assert ten[1:3] == ["100 / 500", "0.20x"]
    assert ten[3] == "5,000 / 3,000" and ten[4] == "50,000 / 30,000"
    assert sixty[1:3] == ["n/a / 2,000", "n/a"] and sixty[6] == "n/a / 4.0 5.0 6.0"
    assert hundred[1:3] == ["100 / n/a", "n/a"] and hundred[5] == "n/a"
    assert one[5] == "128" and one[6] == "1.0 2.0 3.0 / 4.0 5.0 6.0"


def test_an_incomplete_geode_point_says_so() -> None:
    (row,) = geode_cells([], [_geode(10, 500.0, complete=False)])
    assert row[4] == "n/a / 30,000 incomplete"


def test_the_markdown_has_the_geode_table_only_with_geode_points() -> None:
    without = markdown_table(_RB, fixed_subscribers=10)
    assert "Apache Geode" not in without
    lines = markdown_table(_RB, fixed_subscribers=10, geode=_GEODE).splitlines()
    assert lines[: len(without.splitlines())] == without.splitlines()
    header = "| " + " | ".join(GEODE_COLUMNS) + " |"
    assert lines.count(header) == 1 and lines.count("| " + " | ".join(COLUMNS) + " |") == 2
    (title,) = [line for line in lines if "Apache Geode" in line]
    assert title.startswith("### ") and "Apache Geode 1.15.1" in title
    assert [line.split(" | ")[0] for line in lines[lines.index(header) + 2 :] if line] == [
        "| 1",
        "| 10",
        "| 60",
        "| 100",
    ]


def test_summary_rows_compare_the_server_cpu_per_put_with_geode_at_each_geode_count() -> None:
    rows = [r for r in summary_rows(_RB, _GEODE) if r.benchmark == SCALING_VS_GEODE]
    assert [r.figure for r in rows] == [
        "server CPU µs per put (60 subscribers)",
        "server CPU µs per put (1 subscribers)",
        "server CPU µs per put (10 subscribers)",
    ]
    by_figure = {r.figure: r for r in rows}
    ten = by_figure["server CPU µs per put (10 subscribers)"]
    assert (ten.regionbus, ten.baseline, ten.ratio) == (100.0, 500.0, 0.2)
    assert not ten.higher_is_better and ten.baseline_name == "Geode 1.15.1 server CPU µs per put"
    assert math.isnan(by_figure["server CPU µs per put (60 subscribers)"].regionbus)
    assert [r for r in summary_rows(_RB) if r.benchmark == SCALING_VS_GEODE] == []


def test_geode_is_a_dotted_line_on_the_subscriber_series_cpu_and_rate_panels_only() -> None:
    panels = plot_lines(_RB, 10, _GEODE)
    (cpu,) = [line for line in panels[("subscribers", "cpu")] if "Geode" in line.label]
    assert (cpu.xs, cpu.ys, cpu.style[-1]) == ([1, 10, 60], [200.0, 500.0, 2_000.0], ":")
    ours = panels[("subscribers", "cpu")][0]
    assert (ours.label, ours.xs, ours.ys) == ("regionbus server", [1, 10, 100], [100.0] * 3)
    assert [line.label for line in panels[("subscribers", "rates")] if "Geode" in line.label] == [
        "Geode 1.15.1 puts/s",
        "Geode 1.15.1 events/s",
    ]
    others = [key for key, lines in panels.items() if any("Geode" in x.label for x in lines)]
    assert sorted(others) == [("subscribers", "cpu"), ("subscribers", "rates")]
    assert not any("Geode" in x.label for x in plot_lines(_RB, 10)[("subscribers", "cpu")])


def test_the_plot_with_geode_is_written(tmp_path: Path) -> None:
    path = plot(_RB, 10, tmp_path / "scaling.png", _GEODE)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=300), out


def _measure(counts: list[int], console: Console) -> list[GeodePoint]:
    return geode_scaling.measure(
        counts, ops=10, value_bytes=100, key_space=10, idle_timeout_s=1.0, console=console
    )


def test_missing_geode_jars_skip_geode_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Path:
        raise PeerSetupError("scripts/bootstrap.sh --peers failed (1): no Maven")

    monkeypatch.setattr(geode_scaling, "ensure_geode_jars", missing)
    console, out = _console()
    assert _measure([1, 10], console) == []
    assert "Apache Geode skipped: its jars or Java are missing" in out.getvalue()
    assert "no Maven" in out.getvalue() and "--no-geode" in out.getvalue()


def test_a_count_that_does_not_fit_is_skipped_saying_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[int] = []
    monkeypatch.setattr(geode_scaling, "ensure_geode_jars", lambda: tmp_path)
    monkeypatch.setattr(geode_scaling, "available_bytes", lambda: 4 * GIB)
    monkeypatch.setattr(progress, "current_log_dir", lambda: tmp_path)

    def harness(options: dict[str, object], work_dir: Path, timeout_s: float) -> GeodeFigures:
        subscribers = int(str(options["subscribers"]))
        ran.append(subscribers)
        answer = json.loads(json.dumps(SCALING_ANSWER))
        answer["throughput"]["subscribers"] = subscribers
        return parse(json.dumps(answer))

    monkeypatch.setattr(geode_scaling, "run_harness", harness)
    console, out = _console()
    points = _measure([60, 1], console)
    assert ran == [1] and [p.subscribers for p in points] == [1]
    assert "Apache Geode at 60 subscribers skipped" in out.getvalue()


def test_no_geode_runs_nothing_and_says_so() -> None:
    console, out = _console()
    options = ScalingOptions(
        subscriber_counts=(1,), bucket_counts=(16,), fixed_subscribers=1,
        subscribers_per_process=25, ops=10, rate=10, latency_seconds=1.0, value_bytes=100,
        fetch_wait_max_ms=100, linger_ms=1, window=10, key_space=10, warmup_seconds=0.0,
        idle_timeout_s=1.0, geode=False,
    )  # fmt: skip
    assert geode_points(options, console) == []
    assert "Apache Geode not run (--no-geode)" in out.getvalue()
