"""Fan-out flat in the number of subscribers that share an interest (the fleet issue, goal
4): the clients of one registration that read one partition of the shared queue topic get
one record per event, addressed to all of them, and still each get every event once, in
order, with the originator left out (docs/behaviour.md §3), values or invalidations as each
registered, and a durable member's replay before its marker (docs/behaviour.md §5)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from support import Recorder, settle, wait_until
from test_continuous_queries import _cq

from regionbus import Operation
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache
from regionbus.schemas.addressing import RECIPIENTS_HEADER, header, is_shared
from regionbus.schemas.codec import decode, split_batch
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.messages import CqEvent, Event, EventKind
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.topics import DEFAULT_CLIENT_PARTITIONS
from regionbus.spark.analytics import queue_analytics

ClientFactory = Callable[..., ClientCache]


def _ids_sharing_a_partition(count: int, prefix: str, like: str | None = None) -> list[str]:
    """``count`` client ids whose partition of the shared queue topic is ``like``'s (or the
    first one's)."""
    target = client_partition(like or f"{prefix}-0", DEFAULT_CLIENT_PARTITIONS)
    found = []
    n = 0
    while len(found) < count:
        candidate = f"{prefix}-{n}"
        n += 1
        if client_partition(candidate, DEFAULT_CLIENT_PARTITIONS) == target:
            found.append(candidate)
    return found


def _queued(
    bootstrap: str, namespace: str, kind: type = Event
) -> dict[int, list[tuple[bytes | None, Any, Any]]]:
    """``{partition: [(key, recipients header, event)]}`` of every event (or ``kind``) of
    region ``r`` in the shared queue topic of the unsecured principal, read by a plain
    Kafka consumer."""
    topic = Topics(namespace).client_queues(None)
    consumer = kafka_consumer(
        {"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.auto.commit": False}
    )
    found: dict[int, list[tuple[bytes | None, Any, Any]]] = {}
    try:
        for partition in range(DEFAULT_CLIENT_PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            offset = low
            while offset < high:
                for message in consumer.consume(500, 0.5):
                    if message.error() is not None:
                        continue
                    offset = (message.offset() or 0) + 1
                    listed = header(message.headers(), RECIPIENTS_HEADER)
                    for framed in split_batch(message.value() or b""):
                        item = decode(framed)
                        event = item.event if type(item) is CqEvent else item
                        if type(item) is kind and event.region == "r":
                            found.setdefault(partition, []).append((message.key(), listed, item))
    finally:
        consumer.close()
    return found


@pytest.fixture
def subscribe(client_factory: ClientFactory) -> Iterator[Callable[..., tuple[Any, Recorder]]]:
    def make(**settings: Any) -> tuple[Any, Recorder]:
        receive_values = settings.pop("receive_values", True)
        durable = settings.pop("durable", False)
        cache = client_factory(**settings)
        recorder = Recorder()
        region = cache.create_region("r", listeners=[recorder])
        region.register_interest(ALL_KEYS, durable=durable, receive_values=receive_values)
        if durable:
            cache.ready_for_events()
        return cache, recorder

    yield make


def test_subscribers_sharing_an_interest_cost_one_record_per_partition_not_one_per_client(
    cache_server: CacheServer,
    client_factory: ClientFactory,
    subscribe: Callable[..., tuple[Any, Recorder]],
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    subscribers = 40
    puts = 20
    recorders = [subscribe()[1] for _ in range(subscribers)]
    ids = list(cache_server.events_routed_by_client())
    assert len(ids) == subscribers
    partitions = {client_partition(c, DEFAULT_CLIENT_PARTITIONS) for c in ids}
    writer = client_factory(subscription_enabled=False).create_region("r")
    for i in range(puts):
        writer.put(f"k{i}", i)
    expected = [("create", f"k{i}", i) for i in range(puts)]
    for recorder in recorders:
        wait_until(lambda r=recorder: len(r.snapshot()) >= puts, what="every event")  # type: ignore[misc]
    for recorder in recorders:
        assert recorder.snapshot() == expected, "each subscriber gets every event once, in order"

    queued = _queued(kafka_bootstrap_servers, namespace)
    events = sum(len(v) for v in queued.values())
    # Per client this was subscribers x puts = 800 events in the queue topic.
    assert events == puts * len(partitions) < subscribers * puts
    records = [(key, listed) for found in queued.values() for key, listed, _ in found]
    assert all(is_shared(key) == (listed is not None) for key, listed in records)
    routed = cache_server.events_routed_by_client()
    assert routed == dict.fromkeys(ids, puts), "counted per client"


def test_a_shared_record_leaves_out_the_originator_and_gives_each_member_its_payload(
    cache_server: CacheServer,
    subscribe: Callable[..., tuple[Any, Recorder]],
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    ids = _ids_sharing_a_partition(5, "member")
    writer_cache, writer_calls = subscribe(client_id=ids[0])
    other_cache, other_calls = subscribe(client_id=ids[1])
    values_cache, values = subscribe(client_id=ids[2])
    values_too_cache, values_too = subscribe(client_id=ids[3])
    invalidations_cache, invalidations = subscribe(client_id=ids[4], receive_values=False)
    writer = writer_cache.get_region("r")
    writer.put("a", 1)
    writer.put("a", 2)
    other_cache.get_region("r").put("b", 3)
    # Each member reads the shared records with a consumer of its own: wait for every one,
    # then for every queue to stay quiet (nothing comes twice).
    for recorder in (values, values_too, writer_calls, other_calls):
        wait_until(lambda r=recorder: len(r.snapshot()) == 3, what="each member's events")  # type: ignore[misc]
    for cache in (writer_cache, other_cache, values_cache, values_too_cache, invalidations_cache):
        settle(cache)
    everything = [("create", "a", 1), ("update", "a", 2), ("create", "b", 3)]
    assert values.snapshot() == values_too.snapshot() == everything
    # Invalidations of entries it does not hold fire no listener (Geode): see the records.
    assert invalidations.snapshot() == []
    # Both writers are members of the records; each hears its own changes once (its local
    # operation), and the other's once. Each key's changes come in order; whether the
    # other member hears "a" = 2 before its own put of "b" is a race (put returns once the
    # server applied it, not once every member heard it).
    for calls in (writer_calls, other_calls):
        assert sorted(calls.snapshot(), key=lambda call: call[1]) == everything
    [records] = _queued(kafka_bootstrap_servers, namespace).values()
    shared = [r for r in records if is_shared(r[0])]
    own = [r for r in records if not is_shared(r[0])]
    assert len(shared) == 3 and {listed for _, listed, _ in shared} == {
        b"\x00" + b"\x00".join(sorted(c.encode() for c in ids[:4])) + b"\x00"
    }
    assert [key for key, _, _ in own] == [ids[4].encode()] * 3, "alone in its group: its own"
    assert [(e.kind, e.key, e.value) for _, _, e in own] == [
        (EventKind.INVALIDATE, "a", None),
        (EventKind.INVALIDATE, "a", None),
        (EventKind.INVALIDATE, "b", None),
    ]


def test_a_member_that_joins_while_the_group_is_written_misses_nothing_and_gets_nothing_twice(
    cache_server: CacheServer,
    client_factory: ClientFactory,
    subscribe: Callable[..., tuple[Any, Recorder]],
) -> None:
    ids = _ids_sharing_a_partition(4, "joiner")
    for client_id in ids[:3]:
        subscribe(client_id=client_id)
    writer = client_factory(subscription_enabled=False).create_region("r")
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:
        i = 0
        while not stop.is_set():
            writer.put(f"k{i % 7}", i)
            written.append(i)
            i += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        wait_until(lambda: len(written) > 20, what="writes before the join")
        late_cache, late = subscribe(client_id=ids[3])
        wait_until(lambda: len(late.snapshot()) > 10, what="events after the join")
    finally:
        stop.set()
        thread.join()
    writer.put("done", 0)
    region = late_cache.get_region("r")
    wait_until(lambda: region.contains_key("done"), what="the last put")
    server = {k: int(v.value) for k, v in cache_server.store.entries("r").items()}
    assert region.local_entries() == server
    values = [v for method, _, v in late.snapshot() if method in ("create", "update")]
    assert len(values) == len(set(values)), "no event twice"
    by_key: dict[str, list[int]] = {}
    for _, key, value in late.snapshot():
        by_key.setdefault(key, []).append(value)
    assert all(v == sorted(v) for v in by_key.values()), "per-key order"


def test_a_durable_member_replays_the_shared_records_queued_while_it_was_away(
    spark_session: Any,
    cache_server: CacheServer,
    client_factory: ClientFactory,
    subscribe: Callable[..., tuple[Any, Recorder]],
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    partners = _ids_sharing_a_partition(2, "partner", like="desk")
    away, _ = subscribe(durable_client_id="desk", durable=True)
    partner_calls = [subscribe(client_id=c)[1] for c in partners]
    away.close(keep_alive=True)
    writer = client_factory(subscription_enabled=False).create_region("r")
    for i in range(10):
        writer.put(f"k{i}", i)
    expected = [("create", f"k{i}", i) for i in range(10)]
    for recorder in partner_calls:
        wait_until(lambda r=recorder: len(r.snapshot()) == 10, what="the partners' events")  # type: ignore[misc]
    # Spark's queue analytics count the shared records as the durable client's backlog.
    analytics = queue_analytics(
        spark_session, kafka_bootstrap_servers=kafka_bootstrap_servers, namespace=namespace
    )
    depths = {r.client_id: r.depth for r in analytics.queues.collect()}
    assert depths["desk"] == 10

    again = client_factory(durable_client_id="desk")
    recorder = Recorder()
    again.create_region("r", listeners=[recorder])
    again.ready_for_events()
    wait_until(lambda: ("region_live", "r", None) in recorder.snapshot(), what="the marker")
    assert recorder.snapshot() == [*expected, ("region_live", "r", None)]
    [records] = _queued(kafka_bootstrap_servers, namespace).values()
    assert len(records) == 10, "one event per put for the durable client and its partners"


def test_holders_of_the_same_cq_in_one_partition_share_its_records_and_each_hears_every_change(
    cache_server: CacheServer,
    client_factory: ClientFactory,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    ids = _ids_sharing_a_partition(4, "holder")
    caches = [client_factory(client_id=c) for c in ids]
    holders = []
    for cache in caches:
        cq, recorder = _cq(cache)
        cq.execute()
        holders.append(recorder)
    writer = caches[0].get_region("r")
    writer.put("late", {"delay": 90})
    writer.put("late", {"delay": 120})
    writer.put("late", {"delay": 10})
    expected = [
        (Operation.CREATE, Operation.CREATE, "late", {"delay": 90}),
        (Operation.UPDATE, Operation.UPDATE, "late", {"delay": 120}),
        (Operation.UPDATE, Operation.DESTROY, "late", {"delay": 10}),
    ]
    for recorder in holders:
        wait_until(lambda r=recorder: len(r.entry_calls()) == 3, what="the CQ events")  # type: ignore[misc]
    for cache in caches:
        settle(cache)  # and nothing after them: no change heard twice
    # CQ events reach the originator too (Geode); each holder hears each change once.
    assert all(recorder.entry_calls() == expected for recorder in holders)
    [records] = _queued(kafka_bootstrap_servers, namespace, CqEvent).values()
    assert len(records) == 3, "one record per change for the four holders"
    assert all(is_shared(key) for key, _, _ in records)
