"""A gateway sender with several batches in flight (``max_batches_in_flight``): a slow
receiving site still gets a serial queue in queue order, nothing lost or duplicated across
a receiver restart, and a batch that overtakes a lost one is not applied before it. Two
sites on the session's Kafka and Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition
from gateway_sites import Site, running_sites
from support import Recorder, wait_until

from regionbus.clients import ALL_KEYS, CacheWriter, EntryEvent
from regionbus.gateways.protocol import GatewayBatch, encode_batch
from regionbus.schemas.codec import encode
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.messages import Event, EventID, EventKind
from regionbus.schemas.naming import Topics


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    """Two sites, ids 1 and 2; everything started on them stops at the end."""
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


class _Slow(CacheWriter):
    """A writer on the receiving site that takes ``delay_s`` per change: the receiver's
    acks come slower than the sender's batches."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def before_create(self, event: EntryEvent) -> None:
        time.sleep(self.delay_s)

    def before_update(self, event: EntryEvent) -> None:
        time.sleep(self.delay_s)


class _UnackedWatch:
    """Samples, on a thread, the batches on the receiver's inbound topic not answered on the
    sender's ack topic yet (high watermarks, read from Kafka): the largest gap seen."""

    def __init__(self, receiving: Site, sending: Site, sender_id: str) -> None:
        topics = Topics(receiving.namespace)
        self._inbound = TopicPartition(topics.gateway_inbound("receiver"), 0)
        self._acks = TopicPartition(topics.gateway_ack(sending.site_id, sender_id), 0)
        self._consumer = kafka_consumer(
            {"bootstrap.servers": receiving.kafka, "group.id": f"{receiving.namespace}.watch"}
        )
        self.most_unacked = 0
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                _, sent = self._consumer.get_watermark_offsets(self._inbound, timeout=5)
                _, acked = self._consumer.get_watermark_offsets(self._acks, timeout=5)
            except Exception as exc:  # not in the consumer's metadata yet, or not made yet
                self.error = exc
                for tp in (self._inbound, self._acks):
                    self._consumer.list_topics(tp.topic, timeout=5)
                sent = acked = 0
            self.most_unacked = max(self.most_unacked, sent - acked)
            self._stop.wait(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _keys_seen(recorder: Recorder) -> list[str]:
    return [key for _, key, _ in recorder.snapshot()]


def test_a_slow_receiver_has_several_batches_in_flight_and_its_site_keeps_queue_order(
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server(writers={"r": [_Slow(0.01)]})
    receiver = b.start_receiver()
    recorder = Recorder()
    b.client().create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    a.start_server(senders={"to-b": 2}, sender_options={"dispatcher_threads": 1})
    sender = a.start_sender(
        "to-b",
        b,
        batch_size=10,
        batch_time_interval_ms=50,
        max_batches_in_flight=8,
        ack_timeout_ms=60_000,  # no resend, even on a loaded machine
    )
    watch = _UnackedWatch(b, a, "to-b")
    region = a.client().create_region("r")
    keys = [f"k{i:03d}" for i in range(300)]
    try:
        for i, key in enumerate(keys):
            region.put(key, i)  # one after the other: the queue holds them in this order
        wait_until(lambda: len(recorder.snapshot()) >= len(keys), 120, "every event at B")
        wait_until(lambda: sender.stats.events_dispatched == len(keys), 30, "every ack")
    finally:
        watch.close()

    # One total order (one dispatcher): B's client saw exactly the queue's order, once each.
    assert _keys_seen(recorder) == keys
    assert sender.stats.batches_in_flight_peak > 1
    # Seen from Kafka, not from the sender: batches were sent before the previous ack.
    assert watch.most_unacked > 1, watch.error
    assert sender.stats.batches_redispatched == 0
    assert receiver.stats.events_applied == len(keys)


def test_a_receiver_restarted_mid_stream_loses_and_duplicates_nothing_and_keeps_order(
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server(writers={"r": [_Slow(0.005)]})
    first = b.start_receiver()
    recorder = Recorder()
    b.client().create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    a.start_server(senders={"to-b": 2}, sender_options={"dispatcher_threads": 1})
    sender = a.start_sender(
        "to-b",
        b,
        batch_size=10,
        batch_time_interval_ms=50,
        max_batches_in_flight=8,
        ack_timeout_ms=2000,
    )
    region = a.client().create_region("r")
    keys = [f"k{i:03d}" for i in range(400)]

    def put_all() -> None:
        for i, key in enumerate(keys):
            region.put(key, i)  # one after the other: the queue holds them in this order

    putter = threading.Thread(target=put_all)
    putter.start()
    wait_until(lambda: len(recorder.snapshot()) >= 100, 60, "a part of the stream at B")
    first.stop()
    assert len(recorder.snapshot()) < len(keys), "the stream went through before the stop"
    putter.join(60)
    # Down longer than the ack timeout: the batches in flight are sent again.
    wait_until(lambda: sender.stats.batches_redispatched >= 1, 30, "a resend")
    second = b.start_receiver()

    wait_until(lambda: len(recorder.snapshot()) >= len(keys), 120, "every event at B")
    wait_until(lambda: sender.stats.events_dispatched >= len(keys), 60, "every ack")
    assert _keys_seen(recorder) == keys
    assert b.values() == {key: str(i).encode() for i, key in enumerate(keys)}
    # The copies sent again were recognised by EventID: each event applied once.
    assert first.stats.events_applied + second.stats.events_applied == len(keys)


def _event(key: str, seq: int, value: int) -> bytes:
    return encode(
        Event(
            event_id=EventID("pipeline-test-member", 7, seq, 0),
            kind=EventKind.UPDATE,
            region="r",
            version=seq,
            timestamp_ms=int(time.time() * 1000),
            originator="pipeline-test",
            key=key,
            value=str(value).encode(),
            serializer="json",
            origin_site_id=1,
            sites_reached=(1,),
        )
    )


def test_a_batch_that_overtakes_a_lost_one_waits_for_it_and_the_order_holds(
    sites: list[Site],
) -> None:
    """Batch 2 of a run lost on the way, batch 3 arrives: 3 is not applied before 2 (its
    events would then also make 2's look like duplicates); the resend of 2 and 3 is."""
    _, b = sites
    b.start_server()
    receiver = b.start_receiver()
    recorder = Recorder()
    b.client().create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    topics = Topics(b.namespace)
    ack_topic = topics.gateway_ack(1, "to-b")  # not made: the acks are not looked at
    producer = kafka_producer({"bootstrap.servers": b.kafka})

    def batch(sequence: int, acked_through: int, resend: bool = False) -> bytes:
        events = tuple(
            _event(f"k{sequence}{i}", sequence * 10 + i, sequence * 10 + i) for i in range(3)
        )
        return encode_batch(
            GatewayBatch(
                f"run1-{sequence}",
                "to-b",
                1,
                ack_topic,
                resend,
                events,
                False,
                sequence,
                acked_through,
            )
        )

    inbound = topics.gateway_inbound("receiver")
    for value in (batch(1, 0), batch(3, 0), batch(2, 1, True), batch(3, 1, True)):
        producer.produce(inbound, value, partition=0)
    assert producer.flush(10) == 0

    expected = [f"k{s}{i}" for s in (1, 2, 3) for i in range(3)]
    wait_until(lambda: len(recorder.snapshot()) >= len(expected), 60, "batches 1, 2, 3 at B")
    assert _keys_seen(recorder) == expected
    assert receiver.stats.batches_out_of_sequence == 1
    assert receiver.stats.duplicates == 0
