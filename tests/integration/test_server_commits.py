"""A running server commits what it applied on {ns}.ops every message_sync_interval_s (the
re-processing window after a failover) and then forgets the stored results below it."""

from __future__ import annotations

from typing import Any

import redis
from confluent_kafka import TopicPartition
from support import wait_until

from regionbus.broker.server import CacheServer
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.naming import RedisKeys, Topics, bucket_of
from regionbus.schemas.transport import watermarks


def test_a_running_server_commits_its_ops_offsets_and_prunes_the_results_below_them(
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
    redis_client: redis.Redis,
) -> None:
    region = client_factory().create_region("r")
    keys = [f"k{i}" for i in range(40)]
    for key in keys:
        region.put(key, key)
    topics, redis_keys = Topics(namespace), RedisKeys(namespace)
    buckets = sorted({bucket_of("r", key, 16) for key in keys})
    group = kafka_consumer(
        {"bootstrap.servers": kafka_bootstrap_servers, "group.id": topics.server_group}
    )
    partitions = [TopicPartition(topics.ops, bucket) for bucket in buckets]
    ends = {tp.partition: watermarks(group, tp, 10)[1] for tp in partitions}

    def committed_to_the_end() -> bool:
        committed = group.committed(partitions, timeout=10)
        return all(tp.offset == ends[tp.partition] for tp in committed)

    try:
        wait_until(committed_to_the_end, 30, "the server's commits of {ns}.ops")
    finally:
        group.close()
    wait_until(
        lambda: all(redis_client.zcard(redis_keys.results_index(b)) == 0 for b in buckets),
        30,
        "the stored results below the committed offsets to be pruned",
    )
    assert cache_server.alive


def test_the_loop_commits_what_was_delivered_without_waiting_for_a_flush(
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    """A flush in the loop stops it for a produce round trip at every sync: whatever
    arrives meanwhile waits (the put->listener tail). The commits follow the delivery
    reports instead."""
    region = client_factory().create_region("r")
    parts = cache_server._parts
    assert parts is not None
    flushes: list[float] = []
    flush = parts.outbox.flush

    def counted_flush(timeout_s: float) -> int:
        flushes.append(timeout_s)
        return flush(timeout_s)

    parts.outbox.flush = counted_flush  # type: ignore[method-assign]
    keys = [f"k{i}" for i in range(40)]
    for key in keys:
        region.put(key, key)
    topics = Topics(namespace)
    buckets = sorted({bucket_of("r", key, 16) for key in keys})
    group = kafka_consumer(
        {"bootstrap.servers": kafka_bootstrap_servers, "group.id": topics.server_group}
    )
    partitions = [TopicPartition(topics.ops, bucket) for bucket in buckets]
    ends = {tp.partition: watermarks(group, tp, 10)[1] for tp in partitions}

    def committed_to_the_end() -> bool:
        committed = group.committed(partitions, timeout=10)
        return all(tp.offset == ends[tp.partition] for tp in committed)

    try:
        wait_until(committed_to_the_end, 30, "the server's commits of {ns}.ops")
    finally:
        group.close()
    assert flushes == []
    assert cache_server.alive
