"""docs/spark.md's raw Kafka example, run as written against real Kafka (the broker address
and topic names swapped for the test's): it copies every record, key, value, headers and
partition, into another topic, and writes nothing back to the one it read."""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from readme_commands import REPOSITORY, block_containing, run_python

from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.naming import Topics

SPARK_DOC = REPOSITORY / "docs" / "spark.md"
_PARTITIONS = 3
_RECORDS = 30
_READ_TIMEOUT_S = 60

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def _records(bootstrap: str, topic: str) -> dict[int, list[Record]]:
    """Every record of ``topic``, per partition, in offset order."""
    consumer = kafka_consumer(
        {"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.auto.commit": False}
    )
    found: dict[int, list[Record]] = {}
    try:
        for partition in range(_PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            consumer.assign([TopicPartition(topic, partition, low)])
            records = found.setdefault(partition, [])
            deadline = time.monotonic() + _READ_TIMEOUT_S
            while low + len(records) < high:
                assert time.monotonic() < deadline, f"{topic} [{partition}] not read in time"
                for message in consumer.consume(100, 1.0):
                    assert message.error() is None, message.error()
                    headers = [(k, bytes(v)) for k, v in message.headers() or []]
                    records.append((message.key(), message.value(), headers))
    finally:
        consumer.close()
    return found


def test_the_raw_example_copies_each_record_into_its_partition_of_another_topic(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    source = Topics(namespace).events
    copy = f"{namespace}.events-copy"
    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})
    for future in admin.create_topics(
        [NewTopic(source, _PARTITIONS, 1), NewTopic(copy, _PARTITIONS, 1)]
    ).values():
        future.result(timeout=15)
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    for i in range(_RECORDS):
        key = f"k{i}".encode() if i % 4 else None
        headers = [("rb.to", b"\x00c-1\x00c-2\x00"), ("n", str(i).encode())] if i % 3 else None
        producer.produce(source, f"v{i}".encode(), key, partition=i % _PARTITIONS, headers=headers)
    assert producer.flush(30) == 0
    produced = _records(kafka_bootstrap_servers, source)

    run_python(
        block_containing(SPARK_DOC, '"events-copy"'),
        {
            '"127.0.0.1:9092"': json.dumps(kafka_bootstrap_servers),
            '"regionbus.events"': json.dumps(source),
            '"events-copy"': json.dumps(copy),
        },
    )

    assert sum(len(r) for r in produced.values()) == _RECORDS
    assert _records(kafka_bootstrap_servers, copy) == produced
    assert _records(kafka_bootstrap_servers, source) == produced, "written back to its source"
