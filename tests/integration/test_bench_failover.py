"""The failover benchmark's phase in a tiny configuration: it runs end to end, and what it
measures holds (no acknowledged put lost, none delivered twice, every orphaned bucket
resumed). Times are not asserted: benchmarks are not timed tests."""

from __future__ import annotations

import math
from pathlib import Path

import redis

from bench.core import Services
from bench.failover import FailoverOptions, failover_phase

_TINY = FailoverOptions(
    rate=200,
    seconds=5.0,
    kill_after_s=2.0,
    servers=2,
    redundancy=1,
    lease_ttl_ms=1_000,
    ops=1,
    window=1,
    key_space=1,
    value_bytes=64,
    fetch_wait_max_ms=100,
    linger_ms=5,
    warmup_seconds=0.5,
    relay_seconds=1.0,
    idle_timeout_s=15.0,
    skip_throughput=True,
)


def test_the_failover_benchmark_kills_a_primary_and_loses_or_repeats_nothing(
    namespace: str,
    kafka_bootstrap_servers: str,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    services = Services(namespace, kafka_bootstrap_servers, redis_url, {})

    figures = failover_phase(services, _TINY, redis_client, tmp_path)

    assert figures.victim_primaries >= 8, "the busiest of two servers holds half the buckets"
    assert figures.sent == 1_000
    assert figures.acked == figures.sent
    assert figures.lost == 0
    assert figures.listener_duplicates == 0
    assert figures.delivered == figures.sent
    assert all(b.new_primary is not None for b in figures.buckets)
    assert not math.isnan(figures.resume_max_ms), "an orphaned bucket never resumed"
    assert figures.server_duplicates is not None, "the survivor printed its counters"
