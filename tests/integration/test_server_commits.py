"""A running server commits what it applied on {ns}.ops every message_sync_interval_s (the
re-processing window after a failover) and then forgets the stored results below it."""

from __future__ import annotations

from typing import Any

import redis
from confluent_kafka import TopicPartition
from support import wait_until

from broker.server import CacheServer
from schemas.kafka_clients import kafka_consumer
from schemas.naming import RedisKeys, Topics, bucket_of
from schemas.transport import watermarks


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
