"""bench.core's read phases at a tiny size, on the session's Kafka and Redis: get_all and a
one-shot OQL query beside raw Redis reading the same entries, every row with its ratio.
Times are not asserted (benchmarks are not timed tests); what each side answered is."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from bench.reads import key_samples, run_reads
from bench.reads_figures import QUERY_REGION, ReadOptions, selected_rows, summary_rows
from bench.services import REGION, BenchOptions, Services
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer

_TINY = ReadOptions(entries=200, keys_per_call=10, calls=20, query_runs=3, value_bytes=64)

_BENCH = BenchOptions(
    ops=1,
    subscribers=1,
    rate=1,
    latency_seconds=1.0,
    value_bytes=64,
    fetch_wait_max_ms=100,
    linger_ms=1,
    writer="async",
    window=1,
    chunk=1,
    key_space=1,
    warmup_seconds=0.0,
    idle_timeout_s=20.0,
)


@pytest.fixture
def bench_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    settings = server_settings.model_copy(update={"regions": [REGION, QUERY_REGION]})
    with CacheServer(settings) as server:
        yield server


def test_get_all_and_the_query_answer_as_raw_redis_does_and_make_rows(
    bench_server: CacheServer, namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> None:
    services = Services(namespace, kafka_bootstrap_servers, redis_url, {})

    figures = run_reads(services, _BENCH, _TINY)

    # Every key of every timed call was found, on both sides; every query run selected the
    # tenth of the documents the filter names, on both sides.
    assert figures.get_all.items == figures.raw_get_all.items == 20 * 10
    assert figures.rows == selected_rows(200) == 20
    assert figures.query.items == figures.raw_query.items == 3 * 20
    stored = bench_server.store.entries(QUERY_REGION)
    assert len(stored) == 200 and len(bench_server.store.entries(REGION)) == 200
    for series in (figures.get_all, figures.raw_get_all, figures.query, figures.raw_query):
        assert series.per_s > 0 and 0 < series.p50_ms <= series.p99_ms
    assert not any(math.isnan(x) for x in figures.load_average)

    rows = summary_rows(figures)
    assert [row.figure for row in rows] == [
        "get_all of 10 keys, calls/s",
        "get_all of 10 keys, p50 (ms)",
        "get_all of 10 keys, p99 (ms)",
        "OQL query over 200 entries (a tenth selected), queries/s",
        "OQL query over 200 entries (a tenth selected), p50 (ms)",
        "OQL query over 200 entries (a tenth selected), p99 (ms)",
    ]
    assert all(not math.isnan(row.ratio) for row in rows)
    assert [row.higher_is_better for row in rows] == [True, False, False] * 2
    assert "HMGET" in rows[0].baseline_name and "HSCAN" in rows[3].baseline_name


def test_the_calls_keys_are_distinct_and_the_same_every_run() -> None:
    samples = key_samples(_TINY)
    assert len(samples) == 2 + 20  # a tenth untimed first
    assert all(len(set(keys)) == 10 for keys in samples)
    assert samples == key_samples(_TINY)
