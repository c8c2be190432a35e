"""What the benchmark tests share: the session's Kafka and Redis in the shape of a
benchmark run's local stack, and a fleet run's options at a tiny scale."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from bench.fleet_run import FleetOptions
from regionbus.devstack import LocalStack

TINY_FLEET = FleetOptions(
    phases=(),
    durable_clients=1,
    registering_processes=2,
    live_subscribers=1,
    sampled=1,
    rate=10,
    seconds=1.0,
    connects=1,
    cleanup_clients=2,
    stalled_subscribers=10,
    stalled_rate=1,
    stalled_seconds=1.0,
    idle_caches=1,
    fetch_wait_max_ms=100,
    linger_ms=1,
)
"""Every phase's options at the smallest the CLI accepts; each test replaces what its
phase reads."""


def session_stack(kafka_bootstrap_servers: str, redis_url: str) -> LocalStack:
    """The session's Kafka and Redis where a benchmark takes a ``LocalStack``.

    Kafka is the session's, not the run's: a phase finds no broker process
    (``kafka=None``) and leaves the broker's CPU unread (NaN).
    """
    return cast(
        LocalStack,
        SimpleNamespace(
            kafka_bootstrap_servers=kafka_bootstrap_servers, redis_url=redis_url, kafka=None
        ),
    )
