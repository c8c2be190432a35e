"""bench.core's Redis Cluster rows: each figure beside the baseline it is read against."""

from __future__ import annotations

from bench.redis_cluster import ClusterFigures, cluster_rows
from bench.report import Latency, Throughput


def _throughput(ops_per_s: float, redis_cpu_s: float) -> Throughput:
    return Throughput(
        sent=1000,
        acked=1000,
        errors=0,
        acked_per_s=ops_per_s,
        readers=1,
        delivered=1000,
        delivered_per_s=ops_per_s,
        per_reader_per_s=ops_per_s,
        complete=True,
        cpu_s={"redis": redis_cpu_s, "server": 0.1},
    )


def _latency(p50_ms: float) -> Latency:
    return Latency(100, 100, 90, 100.0, p50_ms, p50_ms * 3, p50_ms * 4)


def test_the_cluster_is_read_against_one_redis_and_wait_against_no_wait() -> None:
    figures = ClusterFigures(
        throughput=_throughput(800, 0.06),
        latency=_latency(20),
        throughput_wait=_throughput(700, 0.07),
        latency_wait=_latency(25),
        apply_ms={
            "one Redis": (1.0, 4.0),
            "Redis Cluster": (4.0, 14.0),
            "Redis Cluster + WAIT 1": (4.4, 14.5),
        },
    )

    rows = {row.figure: row for row in cluster_rows(_throughput(1000, 0.02), _latency(18), figures)}

    assert rows["ops applied/s, Redis Cluster"].ratio == 0.8
    assert round(rows["Redis CPU µs per op, Redis Cluster (6 nodes)"].ratio, 6) == 3.0
    assert rows["put→listener p50 with WAIT 1 (ms)"].baseline == 20
    wait = rows["store batch of 10 puts p50 with WAIT 1 (ms)"]
    assert (wait.regionbus, wait.baseline, wait.higher_is_better) == (4.4, 4.0, False)
    assert rows["store batch of 10 puts p50, Redis Cluster (ms)"].baseline == 1.0
    assert rows["store batch of 10 puts p99 with WAIT 1 (ms)"].regionbus == 14.5
    assert all(row.benchmark == "core" for row in rows.values())
