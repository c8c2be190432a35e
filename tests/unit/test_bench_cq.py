"""bench.cq's rows: CQ beside raw Kafka and beside interest, the scaling rows, and Apache
Geode's CQ rows paired with them by name (a renamed figure would leave Geode's rows n/a)."""

from __future__ import annotations

import math

from bench.cq import SCALING_POINTS, CqFigures, summary_rows
from bench.peers.geode_cq import CQ_VS_GEODE
from bench.peers.geode_cq import summary_rows as geode_cq_rows
from bench.peers.geode_figures import parse
from bench.report import Latency, Throughput
from bench.summary import with_peers
from tests.unit.test_bench_peers import HARNESS_STDOUT


def _throughput(delivered_per_s: float, readers: int, server_cpu_s: float = 1.0) -> Throughput:
    return Throughput(
        10, 10, 0, 100.0, readers, 10, delivered_per_s, 1.0, True, {"server": server_cpu_s}
    )


def _latency(p50_ms: float, p99_ms: float) -> Latency:
    return Latency(10, 10, 10, 1000.0, p50_ms, p99_ms, p99_ms)


FIGURES = CqFigures(
    interest_latency=_latency(5.0, 50.0),
    cq_latency=_latency(6.0, 60.0),
    relay_latency=_latency(2.0, 20.0),
    interest_throughput=_throughput(4000.0, 4),
    cq_throughput=_throughput(3000.0, 4),
    raw_fanout=_throughput(12000.0, 4),
    holders_cpu_us={1: 100.0, 10: 150.0, 100: 600.0},
    interested_cpu_us={1: 90.0, 10: 140.0, 100: 590.0},
    distinct_cpu_us={1: 100.0, 10: 190.0, 100: 1000.0},
    load_average="1.0 1.0 1.0",
)


def test_cq_rows_put_cq_beside_raw_kafka_interest_and_the_scaling_points() -> None:
    rows = {row.figure: row for row in summary_rows(FIGURES)}
    delivered = rows["CQ events delivered/s (4 clients)"]
    assert (delivered.regionbus, delivered.baseline) == (3000.0, 12000.0)
    assert rows["CQ events delivered/s (4 clients) vs interest"].baseline == 4000.0
    assert rows["put→CQ listener p99 (ms)"].ratio == 3.0
    assert rows["put→CQ listener p50 (ms) vs interest"].baseline == 5.0
    for count in SCALING_POINTS:
        holders = rows[f"server CPU µs/change, {count} clients holding the same CQ"]
        assert holders.baseline == FIGURES.interested_cpu_us[count]
    assert rows["server CPU µs/change, 100 distinct CQs"].ratio == 10.0


def test_geodes_cq_rows_take_regionbus_figures_from_bench_cq() -> None:
    geode = geode_cq_rows(parse(HARNESS_STDOUT))
    assert {row.benchmark for row in geode} == {CQ_VS_GEODE}
    filled = [r for r in with_peers([*summary_rows(FIGURES), *geode]) if r.benchmark == CQ_VS_GEODE]
    assert [r.regionbus for r in filled] == [3000.0, 6.0, 60.0]
    assert not any(math.isnan(r.ratio) for r in filled)
