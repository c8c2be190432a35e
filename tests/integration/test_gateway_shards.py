"""A gateway sender's queue split into shards, each sent by a primary of its own: a
parallel sender (a partition per bucket) sent by several processes at once, as Geode runs
a parallel sender on every member hosting primary buckets. Two sites on the session's
Kafka and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gateway_sites import Site, running_sites
from support import wait_until

from regionbus.broker.status import cluster_status
from regionbus.gateways.queue_reader import shard_partitions
from regionbus.gateways.sender import GatewaySender
from regionbus.runtime.redis_connect import connect_redis
from regionbus.schemas.naming import sender_role


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    """Two sites, ids 1 and 2; everything started on them stops at the end."""
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def _shard(a: Site, b: Site, shard: int, member: str, *, wait: bool = True) -> GatewaySender:
    """Start shard ``shard`` of 2 of sender ``to-b`` as member ``member`` (``wait``: until
    it is primary)."""
    return a.start_sender(
        "to-b",
        b,
        wait_primary=wait,
        shard=shard,
        shards=2,
        member_id=member,
        batch_time_interval_ms=100,
    )


def test_two_shards_of_a_parallel_sender_are_primary_at_once_and_send_every_event_once(
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server()
    receiver = b.start_receiver()
    server = a.start_server(senders={"to-b": 2}, parallel=True)
    buckets = server.settings.total_buckets
    first = _shard(a, b, 0, "shard-0")
    second = _shard(a, b, 1, "shard-1")
    # Both hold a lease of their own: neither waits for the other.
    assert first.is_primary and second.is_primary
    assert first.role == sender_role("to-b", 0, 2) != second.role == sender_role("to-b", 1, 2)
    # regionbus status shows one sender, held by both shards.
    redis_client = connect_redis(server.settings)
    try:
        status = cluster_status(
            redis_client, a.namespace, buckets, server.settings.librdkafka(), 30.0
        )
    finally:
        redis_client.close()
    assert [(q.queue_id, q.primary) for q in status.gateway_senders] == [
        ("to-b", "shard-0 (shard 0), shard-1 (shard 1)")
    ]

    region = a.client().create_region("r")
    entries = {f"k{i}": i for i in range(300)}
    region.put_all(entries)
    wait_until(lambda: len(b.values()) == len(entries), 60, "every event on site B")
    assert b.values() == a.values()

    wait_until(
        lambda: first.stats.events_dispatched + second.stats.events_dispatched == len(entries),
        30,
        "both shards' acks",
    )
    # Each shard sent the events of its own buckets' partitions, and only those.
    assert first.stats.events_dispatched > 0 and second.stats.events_dispatched > 0
    assert first._reader.owned_partitions == shard_partitions(buckets, 0, 2)
    assert second._reader.owned_partitions == shard_partitions(buckets, 1, 2)
    assert receiver.stats.duplicates == 0
    assert receiver.stats.batches_out_of_sequence == 0


def test_a_shards_standby_takes_over_its_partitions_and_the_other_shard_goes_on(
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server()
    receiver = b.start_receiver()
    a.start_server(senders={"to-b": 2}, parallel=True)
    first = _shard(a, b, 0, "shard-0")
    second = _shard(a, b, 1, "shard-1")
    standby = _shard(a, b, 1, "shard-1-standby", wait=False)
    region = a.client().create_region("r")
    region.put_all({f"before{i}": i for i in range(100)})
    wait_until(lambda: len(b.values()) == 100, 60, "the first events on site B")
    assert not standby.is_primary

    second.stop()
    assert standby.wait_primary(30), "shard 1's standby never took over"
    assert first.is_primary
    region.put_all({f"after{i}": i for i in range(100)})
    wait_until(lambda: len(b.values()) == 200, 60, "every event on site B")
    assert b.values() == a.values()
    wait_until(
        lambda: (
            first.stats.events_dispatched
            + second.stats.events_dispatched
            + standby.stats.events_dispatched
            == 200
        ),
        30,
        "every shard's acks",
    )
    assert standby.stats.events_dispatched > 0
    assert receiver.stats.duplicates == 0
