"""Acknowledged batches leave the queue topics of gateway senders and async event queues
(Kafka DeleteRecords), as Geode removes a batch once acked; unacked ones never do."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from confluent_kafka import TopicPartition
from gateway_sites import Site, running_sites, start_async_event_queue
from support import wait_until

from regionbus.gateways.async_event_queue import AsyncEvent, AsyncEventListener
from regionbus.gateways.queue_trim import TRIM_INTERVAL_S
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.transport import watermarks

_ACKED = 30


class _Gate(AsyncEventListener):
    """Accepts every batch, except one holding the key ``hold`` while :attr:`closed`."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.accepted: list[str] = []
        self.refusals = 0
        self._lock = threading.Lock()

    def process_events(self, events: list[AsyncEvent]) -> bool:
        with self._lock:
            if self.closed.is_set() and any(e.key == "hold" for e in events):
                self.refusals += 1
                return False
            self.accepted.extend(e.key for e in events)
            return True


class _Watermarks:
    """Reads one partition's low and high watermark (asked of the broker each time)."""

    def __init__(self, kafka: str, topic: str) -> None:
        self._consumer = kafka_consumer({"bootstrap.servers": kafka, "group.id": f"{topic}.w"})
        self._partition = TopicPartition(topic, 0)

    def low(self) -> int:
        return watermarks(self._consumer, self._partition, 10)[0]

    def high(self) -> int:
        return watermarks(self._consumer, self._partition, 10)[1]

    def close(self) -> None:
        self._consumer.close()


@pytest.fixture
def site(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[Site]:
    with ExitStack() as stack:
        yield Site(stack, namespace, kafka_bootstrap_servers, redis_url, 1)


def test_an_async_event_queue_trims_what_its_listener_accepted_and_never_an_unaccepted_batch(
    site: Site,
) -> None:
    site.start_server(async_event_queues=("audit",))
    gate = _Gate()
    start_async_event_queue(site, "audit", gate, batch_size=10, retry_interval_ms=100)
    marks = _Watermarks(site.kafka, f"{site.namespace}.aeq.audit")
    site.stack.callback(marks.close)
    region = site.client().create_region("r")
    for i in range(_ACKED):
        region.put(f"k{i:02d}", i)  # one queue record each: offsets 0-29

    wait_until(lambda: len(gate.accepted) == _ACKED, 30, "the listener to accept every event")
    wait_until(lambda: marks.low() == _ACKED, 30, "the accepted records to be deleted")

    gate.closed.set()
    region.put("hold", 1)  # offset 30, refused and redelivered while the gate is closed
    region.put("after", 2)
    # Refused again and again over several trim intervals: the low watermark stays.
    refusals_over_intervals = int(3 * TRIM_INTERVAL_S / 0.1)
    lows = []
    while gate.refusals < refusals_over_intervals:
        lows.append(marks.low())
    assert set(lows) == {_ACKED}
    assert "hold" not in gate.accepted

    gate.closed.clear()
    wait_until(lambda: "after" in gate.accepted, 30, "the held batch to be accepted")
    wait_until(lambda: marks.low() == marks.high() == _ACKED + 2, 30, "the rest deleted")


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def test_a_gateway_sender_trims_its_queue_only_after_the_remote_ack(sites: list[Site]) -> None:
    a, b = sites
    b.start_server()
    # One dispatcher partition: the ten events all in the partition watched.
    a.start_server(senders={"to-b": 2}, sender_options={"dispatcher_threads": 1})
    sender = a.start_sender("to-b", b, ack_timeout_ms=500, batch_time_interval_ms=50)
    marks = _Watermarks(a.kafka, f"{a.namespace}.gw.to-b")
    a.stack.callback(marks.close)
    region = a.client().create_region("r")
    for future in [region.put_async(f"k{i}", i) for i in range(10)]:
        future.result(30)

    # No receiver: every send of the batch goes unacked, over several trim intervals.
    lows = []
    while sender.stats.batches_redispatched < int(3 * TRIM_INTERVAL_S / 0.5) + 1:
        lows.append(marks.low())
    assert set(lows) == {0} and marks.high() == 10

    b.start_receiver()
    wait_until(lambda: sender.stats.events_dispatched == 10, 60, "the remote ack")
    wait_until(lambda: marks.low() == 10, 30, "the acked batch to be deleted")
    b.wait_for("k9", b"9")
