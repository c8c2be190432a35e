"""CacheWriter aborts (client and server side), EventID duplicate suppression, and bad input."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from support import (
    Recorder,
    Sentinel,
    Vetoing,
    entry_operation,
    send_raw_batch,
    wait_until,
)

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.schemas.codec import decode, encode, encode_batches, split_batch
from regionbus.schemas.errors import CacheWriterError, ValueTooLargeError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.messages import Event, EventKind, OperationKind
from regionbus.schemas.naming import Topics, bucket_of


def test_a_client_writer_abort_changes_nothing_anywhere(cache_server, client_factory) -> None:  # type: ignore[no-untyped-def]
    veto = Vetoing(keys={"no"}, region_ops=True)
    own = Recorder()
    region = client_factory().create_region("r", writer=veto, listeners=[own])
    recorder = Recorder()
    other = client_factory().create_region("r", listeners=[recorder])
    other.register_interest(ALL_KEYS)
    region.put("yes", 1)
    with pytest.raises(CacheWriterError):
        region.put("no", 1)
    with pytest.raises(CacheWriterError):
        region.put_all({"fine": 1, "no": 2})
    with pytest.raises(CacheWriterError):
        region.destroy("no")
    with pytest.raises(CacheWriterError):
        region.clear()
    assert set(cache_server.store.entries("r")) == {"yes"}
    assert region.keys() == ["yes"]
    assert [c[1] for c in own.snapshot()] == ["yes"]
    assert Sentinel(region, recorder).fence() == [("create", "yes", 1)]
    assert "before_create:no" in veto.calls and "before_region_clear" in veto.calls


def test_a_server_writer_abort_changes_nothing_anywhere(
    server_settings: ServerSettings, client_factory
) -> None:  # type: ignore[no-untyped-def]
    settings = server_settings.model_copy(
        update={"plugins": {"r": ["writers_plugin:RefuseNegative"]}}
    )
    with CacheServer(settings) as server:
        own = Recorder()
        region = client_factory().create_region("r", listeners=[own])
        recorder = Recorder()
        other = client_factory().create_region("r", listeners=[recorder])
        other.register_interest(ALL_KEYS)
        region.put("keep-me", 1)
        region.put("x", 5)
        with pytest.raises(CacheWriterError, match="negative"):
            region.put("x", -1)
        with pytest.raises(CacheWriterError, match="may not be destroyed"):
            region.destroy("keep-me")
        with pytest.raises(CacheWriterError, match="clearing is not allowed"):
            region.clear()
        entries = server.store.entries("r")
        assert {k: e.value for k, e in entries.items()} == {"keep-me": b"1", "x": b"5"}
        assert region.local_entries() == {"keep-me": 1, "x": 5}
        assert len(own.snapshot()) == 2
        assert Sentinel(region, recorder).fence() == [("create", "keep-me", 1), ("create", "x", 5)]


def test_a_retried_operation_with_a_seen_event_id_is_applied_once(
    cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    recorder = Recorder()
    reader_cache = client_factory()
    reader = reader_cache.create_region("r", listeners=[recorder])
    reader.register_interest(ALL_KEYS)
    writer = client_factory().create_region("r")
    op, bucket = entry_operation("app-1", OperationKind.PUT, "dup", 0, b'"first"', request_id=7)
    # the retry carries the same EventID (and, to prove it is not re-applied, another value).
    # Both go in one batch message: a retry processed after the server committed and pruned
    # the first one's stored result is recognised too, but re-emits no event.
    retry = op._replace(request_id=8, value=b'"second"', possible_duplicate=True)
    send_raw_batch(kafka_bootstrap_servers, namespace, [op, retry], bucket)
    wait_until(lambda: cache_server.stats.duplicates == 1, what="the retry to be processed")
    before = Sentinel(writer, recorder).fence()
    assert before == [("create", "dup", "first")]
    entry = cache_server.store.entries("r")["dup"]
    assert entry.value == b'"first"'
    assert cache_server.stats.operations_applied == 2  # the put and the sentinel
    assert reader_cache.subscription_stats.duplicates_dropped == 1  # the re-emitted event


def test_a_resent_event_with_a_seen_event_id_reaches_no_listener(
    cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    recorder = Recorder()
    reader_cache = client_factory()
    reader = reader_cache.create_region("r", listeners=[recorder])
    reader.register_interest(ALL_KEYS)
    writer = client_factory().create_region("r")
    writer.put("k", "v1")
    Sentinel(writer, recorder).fence()
    # read back the event the server queued for the reader and resend it, as a new primary
    # would after a failover
    topic = Topics(namespace).queue(reader_cache.client_id)
    consumer = kafka_consumer({"bootstrap.servers": kafka_bootstrap_servers, "group.id": "probe"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    first = consumer.consume(1, 10)[0]
    consumer.close()
    event = decode(split_batch(first.value())[0])
    assert isinstance(event, Event) and event.key == "k"
    resent = event._replace(possible_duplicate=True)
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(topic, encode(resent))
    producer.flush(10)
    assert Sentinel(writer, recorder, key="sentinel-2").fence() == []
    assert reader_cache.subscription_stats.duplicates_dropped == 1
    assert reader.local_entries()["k"] == "v1"


def test_garbage_on_the_ops_topic_is_dead_lettered_and_the_server_keeps_going(
    cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    topics = Topics(namespace)
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(topics.ops, b"\x00not a regionbus message", partition=3)
    producer.produce(topics.ops, b"\xb1\x01\xff\xff\xff", partition=3)
    producer.flush(10)
    region = client_factory().create_region("r")
    region.put("after", 1)  # the server is still processing
    assert region.get("after") == 1
    consumer = kafka_consumer(
        {"bootstrap.servers": kafka_bootstrap_servers, "group.id": "dlq-probe"}
    )
    consumer.assign([TopicPartition(topics.dead_letter, 0, 0)])
    letters = []
    deadline = time.monotonic() + 15
    while len(letters) < 2 and time.monotonic() < deadline:
        letters += [m for m in consumer.consume(10, 0.5) if m.error() is None]
    consumer.close()
    assert [m.value() for m in letters] == [b"\x00not a regionbus message", b"\xb1\x01\xff\xff\xff"]
    reasons = [dict(m.headers())["rb.reason"].decode() for m in letters]
    assert "not a regionbus message" in reasons[0]
    assert "undecodable Operation" in reasons[1]
    assert dict(letters[0].headers())["rb.source.topic"] == topics.ops.encode()
    assert cache_server.stats.dead_letters == 2


def test_a_value_over_the_maximum_size_is_refused_and_nothing_is_applied(
    server_settings: ServerSettings, client_factory
) -> None:  # type: ignore[no-untyped-def]
    settings = server_settings.model_copy(update={"max_value_size_bytes": 1000})
    with CacheServer(settings) as server:
        region = client_factory().create_region("r")
        region.put("small", "x" * 100)
        with pytest.raises(ValueTooLargeError, match="max_value_size_bytes=1000"):
            region.put("big", "x" * 2000)
        assert set(server.store.entries("r")) == {"small"}
        assert region.keys() == ["small"]


def test_event_kinds_carried_by_the_events_log(
    cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    region = client_factory().create_region("r")
    region.put("e", 1)
    region.put("e", 2)
    region.destroy("e")
    bucket = bucket_of("r", "e", 16)
    consumer = kafka_consumer(
        {"bootstrap.servers": kafka_bootstrap_servers, "group.id": "events-probe"}
    )
    consumer.assign([TopicPartition(Topics(namespace).events, bucket, 0)])
    events: list[Event] = []
    deadline = time.monotonic() + 15
    while len(events) < 3 and time.monotonic() < deadline:
        events += [decode(m.value()) for m in consumer.consume(10, 0.5) if m.error() is None]  # type: ignore[misc]
    consumer.close()
    assert [e.kind for e in events] == [EventKind.CREATE, EventKind.UPDATE, EventKind.DESTROY]
    assert [e.event_id.sequence for e in events] == [0, 1, 2]
    assert all(e.event_id.bucket == bucket for e in events)
    assert events[0].version < events[1].version < events[2].version


def test_a_broken_message_inside_a_batch_is_dead_lettered_and_the_rest_applied(
    cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    good, bucket = entry_operation("app-2", OperationKind.PUT, "good", 0, b"1")
    broken = b"\xb1\x01garbage"
    later = good._replace(request_id=2, event_id=EventID("app-2", 1, 1, bucket), value=b"2")
    [batch] = encode_batches([encode(good), broken, encode(later)])
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(Topics(namespace).ops, batch, partition=bucket)
    producer.flush(10)
    wait_until(lambda: cache_server.stats.dead_letters == 1, what="the dead letter")
    wait_until(lambda: "good" in cache_server.store.entries("r"), what="the batch applied")
    assert cache_server.store.entries("r")["good"].value == b"2"
    consumer = kafka_consumer({"bootstrap.servers": kafka_bootstrap_servers, "group.id": "dlq"})
    consumer.assign([TopicPartition(Topics(namespace).dead_letter, 0, 0)])
    letters: list = []
    deadline = time.monotonic() + 15
    while not letters and time.monotonic() < deadline:
        letters = [m for m in consumer.consume(10, 0.5) if m.error() is None]
    consumer.close()
    assert [m.value() for m in letters] == [broken]
