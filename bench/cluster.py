"""A cluster of cache server processes for the benchmarks, started and settled.

Servers start one after the other (their ages differ, so the oldest does not take every
bucket), each in its own process and namespace-scoped; the cluster is ready when every
bucket has a live primary and its secondaries and primaries are balanced.
"""

from __future__ import annotations

import logging
import secrets
import time
from contextlib import ExitStack
from pathlib import Path

import redis

from bench.server import BenchError, ServerProcess
from bench.services import REGION, Services
from regionbus.broker.status import ClusterStatus, cluster_status
from regionbus.devstack import LocalStack
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS

log = logging.getLogger("regionbus.bench")

_SETTLE_TIMEOUT_S = 90.0
_SETTLE_POLL_S = 0.2


def _settled(status: ClusterStatus, members: set[str], redundancy: int) -> bool:
    """Every bucket has a live primary and its secondaries, primaries balanced."""
    if {m.member_id for m in status.members} != members:
        return False
    if any(b.primary not in members or len(b.secondaries) < redundancy for b in status.buckets):
        return False
    counts = [m.primaries for m in status.members]
    return max(counts) - min(counts) <= 1


def start_cluster(
    stack: ExitStack,
    *,
    services: Services,
    servers: int,
    redundancy: int,
    lease_ttl_ms: int,
    fetch_wait_max_ms: int,
    linger_ms: int,
    redis_client: redis.Redis,
    work_dir: Path,
) -> dict[str, ServerProcess]:
    """Start ``servers`` cache servers ``s1``, ``s2``, ... one after the other (so their
    ages differ), each stopped when ``stack`` closes; wait until the buckets are settled.

    Args:
        stack: Stops every server started when it closes.
        services: Kafka, Redis and the namespace of the cluster.
        servers: How many.
        redundancy: ``REGIONBUS_SUBSCRIPTION_REDUNDANCY`` (at most ``servers - 1``).
        lease_ttl_ms: ``REGIONBUS_LEASE_TTL_MS`` of every server.
        fetch_wait_max_ms: ``fetch.wait.max.ms`` of the servers' consumers.
        linger_ms: ``linger.ms`` of the servers' producers.
        redis_client: A connection to that Redis (bucket status).
        work_dir: Where the servers' logs go.

    Returns:
        The servers by member id.

    Raises:
        BenchError: a server did not start, or the buckets did not settle in 90 s.
    """
    redundancy = min(redundancy, servers - 1)
    started: dict[str, ServerProcess] = {}
    for n in range(1, servers + 1):
        member_id = f"s{n}"
        started[member_id] = stack.enter_context(
            ServerProcess(
                namespace=services.namespace,
                kafka_bootstrap_servers=services.kafka_bootstrap_servers,
                redis_url=services.redis_url,
                regions=(REGION,),
                fetch_wait_max_ms=fetch_wait_max_ms,
                linger_ms=linger_ms,
                log_path=work_dir / f"{services.namespace}-{member_id}.log",
                member_id=member_id,
                env={
                    "REGIONBUS_SUBSCRIPTION_REDUNDANCY": str(redundancy),
                    "REGIONBUS_LEASE_TTL_MS": str(lease_ttl_ms),
                },
            )
        )
        log.info("server %s started: pid %s", member_id, started[member_id].pid)
    deadline = time.monotonic() + _SETTLE_TIMEOUT_S
    while not _settled(
        cluster_status(redis_client, services.namespace, DEFAULT_TOTAL_BUCKETS),
        set(started),
        redundancy,
    ):
        if time.monotonic() > deadline:
            raise BenchError(f"the buckets of {services.namespace} did not settle")
        time.sleep(_SETTLE_POLL_S)
    return started


def fresh_services(local: LocalStack) -> Services:
    """The stack's Kafka and Redis under a new namespace (so every phase has fresh topics)."""
    return Services(
        f"bench.{secrets.token_hex(3)}",
        local.kafka_bootstrap_servers,
        local.redis_url,
        {
            "kafka": local.kafka.pid if local.kafka else None,
            "redis": local.redis.pid if local.redis else None,
        },
    )


__all__ = ["fresh_services", "start_cluster"]
