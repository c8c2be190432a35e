"""The scaling benchmark's machinery on one tiny point, on the session's Kafka and Redis:
two subscribers in two child processes, the latency and throughput phases and the raw
baselines. Times are not asserted (benchmarks are not timed tests); completeness is."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from bench.scaling import ScalingOptions, measure_point, raw_baselines, registered_points
from bench.scaling_figures import markdown_table, plot_lines
from bench.services import REGION, Services
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings
from tests.integration.bench_session import session_stack

_TINY = ScalingOptions(
    subscriber_counts=(2,),
    bucket_counts=(16,),
    fixed_subscribers=2,
    subscribers_per_process=1,
    ops=300,
    rate=50,
    latency_seconds=2.0,
    value_bytes=64,
    fetch_wait_max_ms=100,
    linger_ms=1,
    window=100,
    key_space=100,
    warmup_seconds=0.5,
    idle_timeout_s=20.0,
)


@pytest.fixture
def bench_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    with CacheServer(server_settings.model_copy(update={"regions": [REGION]})) as server:
        yield server


def test_one_point_with_two_subscriber_processes_measures_everything_against_raw_kafka(
    bench_server: CacheServer, namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> None:
    services = Services(namespace, kafka_bootstrap_servers, redis_url, {})
    settings = services.client_settings(_TINY.bench_options(1), subscription_enabled=False)
    writer_cache = ClientCache(ClientSettings(**settings))
    try:
        writer = writer_cache.create_region(REGION, serializer=BytesSerializer())
        point = measure_point(services, _TINY, 2, 16, writer)
    finally:
        writer_cache.close()

    assert (point.subscribers, point.buckets) == (2, 16)
    assert point.complete, "both subscribers got every put"
    assert point.ops_per_s > 0 and point.delivered_per_s > point.ops_per_s
    assert 0 < point.p50_ms <= point.p99_ms
    assert not any(math.isnan(x) for x in point.load_average)

    (measured,) = raw_baselines(services, _TINY, [point], Console(quiet=True))
    assert measured.raw_ops_per_s > 0 and measured.raw_delivered_per_s > 0
    assert 0 < measured.raw_p50_ms <= measured.raw_p99_ms
    assert "| 2 | 16 |" in markdown_table([measured], 2)


def test_the_registered_series_reads_the_server_cpu_per_put_at_each_count(
    kafka_bootstrap_servers: str, redis_url: str, tmp_path: Path
) -> None:
    # Kafka is the session's, not the run's: the broker's CPU is not read.
    local = session_stack(kafka_bootstrap_servers, redis_url)
    options = replace(_TINY, registered_subscriber_counts=(2, 1), registered_ops=150)

    registered = registered_points(local, options, tmp_path, Console(quiet=True))

    assert [r.subscribers for r in registered] == [1, 2]
    assert all(r.server_cpu_us_per_op > 0 for r in registered)
    assert all(r.idle_server_ms_per_s >= 0 for r in registered)
    assert all(math.isnan(r.kafka_cpu_us_per_op) for r in registered)
    (line,) = [
        x
        for x in plot_lines([], 2, registered=registered)[("subscribers", "cpu")]
        if "registered" in x.label
    ]
    assert line.xs == [1, 2]
