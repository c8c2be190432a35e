"""The raw Kafka children of the benchmarks: the baselines regionbus is measured against.

Raw consumers (``assign()``, messages counted, not decoded), the raw two-hop relay and the
bare fan-out relay, each a child process speaking ``bench.workers``' pipe protocol, and the
producer helpers the raw writers share.
"""

from __future__ import annotations

import threading
import time
import uuid
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage

from bench.workers import Tally, child_signals, tallies_result, wait_until_done
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.transport import assign_from

_CONSUME_BATCH = 500
_CONSUME_TIMEOUT_S = 0.1


def raw_producer(kafka_config: dict[str, Any], linger_ms: int) -> Producer:
    """A producer with the clients' settings: ``linger.ms``, ``acks=all``, idempotence."""
    return kafka_producer(
        {**kafka_config, "linger.ms": linger_ms, "acks": "all", "enable.idempotence": True}
    )


def produce(
    producer: Producer, topic: str, value: bytes | None, key: bytes | None, partition: int
) -> None:
    """Produce one message, serving delivery reports while the local queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, partition=partition)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.05)


def take(consumer: Consumer) -> list[KafkaMessage]:
    """Wait up to 100 ms for one message, then take whatever else is already fetched.

    ``Consumer.consume(n, timeout)`` alone would wait for ``n`` messages or the whole
    timeout, adding up to the timeout to every hop: not a fair baseline.
    """
    first = consumer.poll(_CONSUME_TIMEOUT_S)
    if first is None:
        return []
    return [first, *consumer.consume(_CONSUME_BATCH - 1, 0)]


def _raw_consumer(
    kafka_config: dict[str, Any], topic: str, partitions: int, fetch_wait_max_ms: int
) -> Consumer:
    consumer = kafka_consumer(
        {
            **kafka_config,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:10]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": fetch_wait_max_ms,
        }
    )
    assign_from(consumer, [TopicPartition(topic, p, 0) for p in range(partitions)], 10)
    return consumer


def run_raw_consumers(
    conn: Connection,
    *,
    kafka_config: dict[str, Any],
    topic: str,
    partitions: int,
    consumers: int,
    fetch_wait_max_ms: int,
    record_latency: bool,
    idle_timeout_s: float,
    topic_each: bool = False,
) -> None:
    """Child: ``consumers`` threads, each an ``assign()`` consumer reading a whole topic.

    Messages are counted, not decoded (the raw baseline).

    Args:
        conn: The pipe to the parent.
        kafka_config: ``bootstrap.servers`` and any security settings.
        topic: Topic to read from its beginning.
        partitions: Its partition count.
        consumers: How many independent readers (each sees every message).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms``, as the regionbus clients use.
        record_latency: Keep send and receive times of every message.
        idle_timeout_s: After ``expect``, give up when nothing arrived for this long.
        topic_each: Reader ``i`` reads a topic of its own, :func:`fanout_topic` ``(topic,
            i)``, as each subscriber reads its own queue (the fan-out relay's outputs).
    """
    child_signals()
    tallies = [Tally(record_latency) for _ in range(consumers)]
    stop = threading.Event()
    ready = threading.Semaphore(0)

    def read(index: int, tally: Tally) -> None:
        name = fanout_topic(topic, index) if topic_each else topic
        consumer = _raw_consumer(kafka_config, name, partitions, fetch_wait_max_ms)
        try:
            first = True
            while not stop.is_set():
                messages = take(consumer)
                if first:
                    ready.release()
                    first = False
                for message in messages:
                    if message.error() is None:
                        tally.hit(message.value())
        finally:
            consumer.close()

    threads = [
        threading.Thread(target=read, args=(i, t), daemon=True) for i, t in enumerate(tallies)
    ]
    try:
        for thread in threads:
            thread.start()
        for _ in threads:
            ready.acquire()
        cpu_start_s = time.process_time()
        conn.send(("ready", None))
        status = wait_until_done(conn, tallies, idle_timeout_s)
        conn.send(("result", tallies_result(tallies, status, cpu_start_s)))
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)


def run_relay(
    conn: Connection,
    *,
    kafka_config: dict[str, Any],
    topic_in: str,
    partitions_in: int,
    topic_out: str,
    fetch_wait_max_ms: int,
    linger_ms: int,
) -> None:
    """Child: the raw hop in the middle; reads ``topic_in`` and produces each message, as
    is, to partition 0 of ``topic_out`` until the parent says stop.

    Args:
        conn: The pipe to the parent.
        kafka_config: ``bootstrap.servers`` and any security settings.
        topic_in: Topic read with ``assign()`` from its beginning.
        partitions_in: Its partition count.
        topic_out: Topic written (one partition, like a subscription queue).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the consumer.
        linger_ms: ``linger.ms`` of the producer.
    """
    child_signals()
    consumer = _raw_consumer(kafka_config, topic_in, partitions_in, fetch_wait_max_ms)
    producer = raw_producer(kafka_config, linger_ms)
    relayed = 0
    try:
        take(consumer)
        conn.send(("ready", None))
        while not conn.poll(0):
            for message in take(consumer):
                if message.error() is None:
                    produce(producer, topic_out, message.value(), message.key(), 0)
                    relayed += 1
            producer.poll(0)
        producer.flush(30)
        conn.send(("result", {"relayed": relayed}))
    finally:
        consumer.close()


def fanout_topic(topic: str, index: int) -> str:
    """The name of output ``index`` of the fan-out relay writing ``topic``'s copies."""
    return f"{topic}.{index}"


def run_fanout_relay(
    conn: Connection,
    *,
    kafka_config: dict[str, Any],
    topic_in: str,
    partitions_in: int,
    topic_out: str,
    fanout: int,
    fetch_wait_max_ms: int,
    linger_ms: int,
) -> None:
    """Child: a bare fan-out relay, the raw shape of a cache server's hot path: reads
    ``topic_in`` and produces each message, as is (no decoding, no Redis), to partition 0
    of each of ``fanout`` topics (:func:`fanout_topic`), as a server routes each put to the
    subscription queues of every subscriber.

    After the parent's ``("expect", n)`` it answers ``("result", {"relayed", "done_ns"})``
    once ``n`` messages are relayed and every copy is acknowledged by Kafka (``done_ns``:
    ``time.time_ns()`` then); ``("stop", None)`` answers at once.

    Args:
        conn: The pipe to the parent.
        kafka_config: ``bootstrap.servers`` and any security settings.
        topic_in: Topic read with ``assign()`` from its beginning.
        partitions_in: Its partition count.
        topic_out: Prefix of the output topics (one partition each).
        fanout: How many output topics every message goes to.
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the consumer.
        linger_ms: ``linger.ms`` of the producer.
    """
    child_signals()
    consumer = _raw_consumer(kafka_config, topic_in, partitions_in, fetch_wait_max_ms)
    producer = raw_producer(kafka_config, linger_ms)
    outputs = [fanout_topic(topic_out, i) for i in range(fanout)]
    relayed = 0
    expected: int | None = None
    try:
        take(consumer)
        conn.send(("ready", None))
        while expected is None or relayed < expected:
            if conn.poll(0):
                kind, arg = conn.recv()
                if kind == "stop":
                    break
                expected = int(arg)
            for message in take(consumer):
                if message.error() is None:
                    for output in outputs:
                        produce(producer, output, message.value(), message.key(), 0)
                    relayed += 1
            producer.poll(0)
        producer.flush(30)
        conn.send(("result", {"relayed": relayed, "done_ns": time.time_ns()}))
    finally:
        consumer.close()
