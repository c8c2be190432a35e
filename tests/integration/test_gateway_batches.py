"""docs/behaviour.md §6: a serial gateway sender's batches, acks, resends and failures,
between two sites (two namespaces of the session Kafka and Redis)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from gateway_sites import Site, running_sites
from support import Recorder, Vetoing, entry_operation, send_raw_operation, wait_until

from regionbus.clients import ALL_KEYS
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.messages import OperationKind


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    """Two sites, ids 1 and 2; everything started on them stops at the end."""
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def test_a_burst_of_250_puts_goes_in_batches_of_100_100_50_and_only_distributable_ops_reach_the_remote_site(  # noqa: E501
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server()
    b.start_receiver()
    b.client().create_region("r").put("b-only", "kept")
    a.start_server(senders={"to-b": 2})
    # Geode's batching, the default: the first batch waits to be full even with nothing in
    # flight.
    sender = a.start_sender("to-b", b, batch_size=100, batch_time_interval_ms=1000)
    region = a.client().create_region("r")

    region.put_all({f"k{i:03d}": i for i in range(250)})
    wait_until(lambda: sender.stats.batch_sizes == [100, 100, 50], 30, "three batches")

    region.put("inv", 1)
    invalidate, bucket = entry_operation("app-1", OperationKind.INVALIDATE, "inv", 0)
    send_raw_operation(a.kafka, a.namespace, invalidate._replace(region="r"), bucket)
    region.get("k000")
    region.clear()
    region.put("sentinel", "last")
    b.wait_for("sentinel", b'"last"')
    b.wait_for("inv", b"1")
    # Geode's default five dispatchers keep order per key only: wait for every key
    wanted = {f"k{i:03d}" for i in range(250)}
    wait_until(lambda: wanted <= b.values().keys(), 30, "every key on site B")

    values = b.values()
    assert values["inv"] == b"1"  # the invalidate did not travel
    assert values["b-only"] == b'"kept"'  # nor did the clear
    assert a.values() == {"sentinel": b'"last"'}
    # inv and sentinel only: nothing else was queued
    wait_until(lambda: sender.stats.events_dispatched == 252, 30, "the last ack")
    assert sender.stats.batch_sizes[:3] == [100, 100, 50]
    assert sender.stats.batches_redispatched == 0


def test_a_lone_event_is_sent_at_once_and_events_gather_into_full_batches_while_it_is_unacked(
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server()
    a.start_server(senders={"to-b": 2})
    sender = a.start_sender(
        "to-b",
        b,
        batch_size=100,
        batch_time_interval_ms=10_000,
        ack_timeout_ms=120_000,
        send_when_idle=True,
    )
    region = a.client().create_region("r")
    started = time.monotonic()
    region.put("lone", 0)  # nothing in flight: sent at once; no receiver acks it yet
    wait_until(lambda: sender.stats.batches_sent == 1, 30, "the lone event's batch sent")
    # Geode's batching would hold it for the whole 10 s interval.
    assert time.monotonic() - started < 5.0

    region.put_all({f"k{i:03d}": i for i in range(250)})
    wait_until(lambda: sender.stats.batches_sent == 4, 60, "three more batches sent")
    b.start_receiver()
    wait_until(lambda: sender.stats.events_dispatched == 251, 60, "every batch acked")
    b.wait_for("k249", b"249")
    assert sender.stats.batch_sizes == [1, 100, 100, 50]
    assert sender.stats.batches_redispatched == 0


def test_receiver_down_during_1000_puts_then_started_gets_all_in_order_with_resends_flagged(
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server()
    b_recorder = Recorder()
    b_region = b.client().create_region("r", listeners=[b_recorder])
    b_region.register_interest(ALL_KEYS)
    a.start_server(senders={"to-b": 2})
    sender = a.start_sender("to-b", b, ack_timeout_ms=1000, batch_time_interval_ms=100)
    region = a.client().create_region("r")

    futures = [region.put_async(f"key{i % 10}", i) for i in range(1000)]
    for future in futures:
        future.result(30)
    wait_until(lambda: sender.stats.batches_redispatched >= 2, 30, "resends while down")
    assert b.values() == {}

    receiver = b.start_receiver()
    final = {f"key{k}": str(990 + k).encode() for k in range(10)}
    # a batch's operations are applied per bucket on site B: order is kept per key
    wait_until(lambda: b.values() == final, 90, "the last put of every key on site B")
    wait_until(lambda: sender.stats.events_dispatched == 1000, 30, "every batch acked")
    per_key: dict[str, list[int]] = {}
    wait_until(lambda: len(b_recorder.snapshot()) >= 1000, 30, "B's subscriber")
    for _, key, value in b_recorder.snapshot():
        per_key.setdefault(key, []).append(value)
    assert per_key == {f"key{k}": list(range(k, 1000, 10)) for k in range(10)}
    # Resends arrived flagged, and every event was applied exactly once: whether a copy
    # was also answered as a duplicate depends on which copies the window had sent when
    # the receiver started, so it is not asserted.
    assert receiver.stats.possible_duplicate_batches >= 1
    assert receiver.stats.events_applied == 1000


def test_an_ack_with_an_exception_drops_and_logs_the_failed_event_and_the_rest_is_applied(
    sites: list[Site], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = sites
    b.start_server(writers={"r": [Vetoing({"bad"})]})
    b.start_receiver()
    a.start_server(senders={"to-b": 2})
    sender = a.start_sender("to-b", b)
    region = a.client().create_region("r")

    with caplog.at_level(logging.ERROR, logger="regionbus.gateways.sender"):
        region.put_all({"a": 1, "bad": 2, "c": 3})
        wait_until(lambda: sender.stats.events_failed == 1, 30, "the failed event")
        region.put("after", 4)
        b.wait_for("after", b"4")

    assert b.values() == {"a": b"1", "c": b"3", "after": b"4"}
    assert a.values()["bad"] == b"2"
    failures = [r.getMessage() for r in caplog.records if "failed event" in r.getMessage()]
    assert len(failures) == 1 and "'bad'" in failures[0] and "CacheWriterError" in failures[0]
    assert sender.stats.batches_redispatched == 0


def test_undecodable_messages_are_dead_lettered_and_sender_and_receiver_keep_going(
    sites: list[Site],
) -> None:
    from confluent_kafka import TopicPartition

    from regionbus.schemas.naming import Topics

    a, b = sites
    b.start_server()
    receiver = b.start_receiver()
    a.start_server(senders={"to-b": 2})
    a.start_sender("to-b", b)
    producer = kafka_producer({"bootstrap.servers": a.kafka})
    producer.produce(f"{a.namespace}.gw.to-b", b"not an event", partition=0)
    producer.produce(Topics(b.namespace).gateway_inbound("receiver"), b"not a batch", partition=0)
    assert producer.flush(10) == 0
    a.client().create_region("r").put("k", "after the garbage")
    b.wait_for("k", b'"after the garbage"')

    assert receiver.stats.dead_letters == 1
    for site, bad in ((a, b"not an event"), (b, b"not a batch")):
        consumer = kafka_consumer(
            {"bootstrap.servers": site.kafka, "group.id": "dead-letter-check"}
        )
        consumer.assign([TopicPartition(f"{site.namespace}.dead-letter", 0, 0)])
        message = consumer.poll(15)
        consumer.close()
        assert message is not None and message.value() == bad
        assert dict(message.headers() or [])["rb.reason"]


def test_one_sender_is_primary_and_a_standby_takes_over_when_it_stops(sites: list[Site]) -> None:
    from regionbus.gateways.sender import GatewaySender
    from regionbus.gateways.sender_settings import GatewaySenderSettings

    a, b = sites
    b.start_server()
    receiver = b.start_receiver()
    a.start_server(senders={"to-b": 2})
    first = a.start_sender("to-b", b)
    standby = GatewaySender(
        GatewaySenderSettings(
            sender_id="to-b",
            namespace=a.namespace,
            kafka_bootstrap_servers=a.kafka,
            redis_url=a.redis_url,
            distributed_system_id=1,
            remote_distributed_system_id=2,
            remote_namespace=b.namespace,
            remote_kafka_bootstrap_servers=b.kafka,
            batch_time_interval_ms=100,
            lease_ttl_ms=3000,
        )
    )
    standby.start()
    a.stack.callback(standby.stop)
    region = a.client().create_region("r")
    region.put_all({f"before{i}": i for i in range(20)})
    wait_until(lambda: first.stats.events_dispatched == 20, 30, "the primary's batches")
    assert not standby.is_primary

    first.stop()
    assert standby.wait_primary(30)
    region.put_all({f"after{i}": i for i in range(20)})
    wait_until(lambda: len(b.values()) == 40, 60, "every event on site B")

    assert b.values() == a.values()
    wait_until(lambda: standby.stats.events_dispatched == 20, 30, "the standby's acks")
    assert receiver.stats.duplicates == 0
