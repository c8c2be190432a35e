"""docs/behaviour.md §6: the order a remote site applies a gateway sender's events in (serial: queue
order; parallel: per bucket), Geode's ``order-policy`` and ``dispatcher-threads`` for serial
senders, and the receiver's option to keep a batch until its region exists; two sites on
the session's Kafka and Redis."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from gateway_sites import Site, running_sites
from pydantic import ValidationError
from support import Recorder, wait_until

from regionbus.broker.config import GatewaySenderSpec, OrderPolicy
from regionbus.clients import ALL_KEYS
from regionbus.schemas.codec import decode_as
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer
from regionbus.schemas.messages import Event
from regionbus.schemas.naming import Topics
from regionbus.schemas.transport import poll_batch


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    """Two sites, ids 1 and 2; everything started on them stops at the end."""
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def _queued(site: Site, sender_id: str, count: int) -> dict[int, list[Event]]:
    """The first ``count`` events of a sender's queue topic, per partition, in order."""
    topic = Topics(site.namespace).gateway(sender_id)
    consumer = kafka_consumer(
        {
            "bootstrap.servers": site.kafka,
            "group.id": f"{topic}.test-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    per_partition: dict[int, list[Event]] = {}
    try:

        def read() -> bool:
            for message in poll_batch(consumer, 500, 0.2):
                if message.error() is None:
                    event = decode_as(message.value(), Event)
                    per_partition.setdefault(message.partition(), []).append(event)
            return sum(len(v) for v in per_partition.values()) >= count

        wait_until(read, 60, f"{count} queued events")
    finally:
        consumer.close()
    return per_partition


def test_a_serial_senders_batches_reach_remote_clients_in_queue_order_across_keys(
    sites: list[Site],
) -> None:
    """Geode ``GatewayReceiverCommand`` applies a batch's events one after the other; with
    one dispatcher a serial queue is one total order, and the remote site keeps it."""
    a, b = sites
    b.start_server()
    b.start_receiver()
    recorder = Recorder()
    b.client().create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    a.start_server(senders={"to-b": 2}, sender_options={"dispatcher_threads": 1})
    a.start_sender("to-b", b, batch_size=100, batch_time_interval_ms=200)
    region = a.client().create_region("r")
    keys = [f"k{i:03d}" for i in range(400)]
    for i, key in enumerate(keys):
        region.put(key, i)  # one after the other: the queue holds them in this order
    wait_until(lambda: len(recorder.snapshot()) >= len(keys), 90, "every event at B's client")
    seen = [key for _, key, _ in recorder.snapshot()]
    inversions = sum(1 for x, y in itertools.pairwise(seen) if x > y)
    assert inversions == 0 and seen == keys


def test_a_serial_queue_is_split_by_order_policy_over_geodes_default_five_dispatchers(
    sites: list[Site], kafka_bootstrap_servers: str
) -> None:
    """Geode ``GatewaySender.DEFAULT_DISPATCHER_THREADS`` (5) and ``DEFAULT_ORDER_POLICY``
    (KEY): a key's events share one dispatcher, so the remote site keeps order per key."""
    a, b = sites
    b.start_server()
    b.start_receiver()
    a.start_server(senders={"to-b": 2})
    region = a.client().create_region("r")
    for round_ in range(5):
        for i in range(20):
            region.put(f"key{i}", round_)
    topic = Topics(a.namespace).gateway("to-b")
    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})
    assert len(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions) == 5
    by_key = _queued(a, "to-b", 100)
    homes: dict[str, set[int]] = {}
    for partition, events in by_key.items():
        for event in events:
            assert event.key is not None
            homes.setdefault(event.key, set()).add(partition)
        per_key: dict[str | None, list[bytes | None]] = {}
        for event in events:
            per_key.setdefault(event.key, []).append(event.value)
        assert all(v == sorted(v) for v in per_key.values())
    assert all(len(p) == 1 for p in homes.values()), "a key's events were split"
    assert len(by_key) > 1, "KEY order spreads keys over the dispatchers"


def test_order_policy_thread_goes_to_one_dispatcher_and_a_parallel_sender_refuses_it(
    sites: list[Site],
) -> None:
    a, _b = sites
    with pytest.raises(ValidationError, match="THREAD"):
        GatewaySenderSpec(parallel=True, order_policy=OrderPolicy.THREAD)
    with pytest.raises(ValidationError):
        GatewaySenderSpec(dispatcher_threads=0)
    assert GatewaySenderSpec().order_policy is OrderPolicy.KEY
    assert GatewaySenderSpec().dispatcher_threads == 5
    a.start_server(senders={"to-b": 2}, sender_options={"order_policy": OrderPolicy.THREAD})
    region = a.client().create_region("r")
    for i in range(40):
        region.put(f"key{i}", i)
    queued = _queued(a, "to-b", 40)
    assert len(queued) == 1, f"one thread's events spread over partitions {sorted(queued)}"
    assert [e.key for e in next(iter(queued.values()))] == [f"key{i}" for i in range(40)]


def test_a_receiver_told_to_keeps_a_batch_until_its_region_exists(sites: list[Site]) -> None:
    """Default (docs/behaviour.md §6, Geode ``GatewaySender.REMOVE_FROM_QUEUE_ON_EXCEPTION`` true):
    the events of a missing region fail and are dropped. With the option the batch stays
    unacked and is applied once the region exists."""
    a, b = sites
    b.start_server(regions=("r",))
    receiver = b.start_receiver(
        keep_batch_until_region_exists=True, missing_region_retry_interval_ms=200
    )
    a.start_server(senders={"to-b": 2}, regions=("r", "late"))
    sender = a.start_sender("to-b", b, batch_time_interval_ms=100)
    a.client().create_region("late").put("x", 1)
    wait_until(lambda: receiver.stats.batches_kept_for_region >= 2, 30, "the batch kept")
    assert sender.stats.events_failed == 0 and sender.stats.events_dispatched == 0
    assert b.server is not None
    b.server.store.create_region("late")
    b.wait_for("x", b"1", region="late")
    wait_until(lambda: sender.stats.events_dispatched == 1, 30, "the batch acked")
    assert sender.stats.events_failed == 0


def test_by_default_a_receiver_drops_the_events_of_a_missing_region(sites: list[Site]) -> None:
    a, b = sites
    b.start_server(regions=("r",))
    receiver = b.start_receiver()
    a.start_server(senders={"to-b": 2}, regions=("r", "late"))
    sender = a.start_sender("to-b", b, batch_time_interval_ms=100)
    a.client().create_region("late").put("x", 1)
    wait_until(lambda: sender.stats.events_failed == 1, 30, "the failed event")
    assert receiver.stats.batches_kept_for_region == 0
