"""A cache server recreates its topics when they disappear under it, and keeps serving."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import ConfigResource
from support import Recorder, entry_operation, wait_until

from regionbus.broker.config import GatewayQueueSpec, ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.schemas.codec import encode
from regionbus.schemas.kafka_clients import kafka_admin, kafka_producer
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import Topics
from regionbus.schemas.topics import (
    DEFAULT_RETENTION_MS,
    KEEP_UNTIL_ACKED,
    ensure_topics,
    server_topic_specs,
)

_PUTS = 5


def _topic_ids(admin: Any, names: list[str]) -> dict[str, str | None]:
    ids: dict[str, str | None] = {}
    for name, future in admin.describe_topics(TopicCollection(names)).items():
        try:
            ids[name] = str(future.result(timeout=10).topic_id)
        except KafkaException:
            ids[name] = None
    return ids


def _retention_ms(admin: Any, topic: str) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return str(configs["retention.ms"].value)


@pytest.fixture
def server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    settings = server_settings.model_copy(
        update={
            "async_event_queues": {"audit": GatewayQueueSpec()},
            "region_async_event_queues": {"r": ["audit"]},
        }
    )
    server = CacheServer(settings)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_deleted_ops_events_and_queue_topics_are_recreated_and_a_later_put_goes_through(
    server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="regionbus.server.topics")
    topics = Topics(namespace)
    gone = [topics.ops, topics.events, f"{namespace}.aeq.audit"]
    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})
    recorder = Recorder()
    client_factory().create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    # No resend masks a put the server does not read: only the server's recovery counts.
    writer = client_factory(retry_interval_ms=600_000, read_timeout_ms=30_000).create_region("r")
    for i in range(_PUTS):
        writer.put("k", i)  # one bucket: its ops partition is read up to offset 5
    wait_until(lambda: len(recorder.snapshot()) == _PUTS, 30, "the events before the deletion")
    before = _topic_ids(admin, gone)

    for future in admin.delete_topics(gone, operation_timeout=30).values():
        future.result(timeout=30)
    # The writer keeps writing: its producer holds the puts until {ns}.ops is back, then
    # delivers them at once, so the recreated partition reaches the old read position
    # (5) before the server reads it again; a server that kept its position skips them.
    during = [writer.put_async("k", 100 + i) for i in range(_PUTS)]

    def warned_of_each() -> bool:
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        return all(any(f"recreated topic {name} " in m for m in warned) for name in gone)

    wait_until(warned_of_each, 30, "a warning naming each topic the server recreated")
    now = _topic_ids(admin, gone)
    assert all(now[name] is not None and now[name] != before[name] for name in gone)
    metadata = admin.list_topics(timeout=10).topics
    assert len(metadata[topics.ops].partitions) == server.settings.total_buckets
    assert len(metadata[topics.events].partitions) == server.settings.total_buckets
    assert _retention_ms(admin, topics.ops) == str(DEFAULT_RETENTION_MS)
    assert _retention_ms(admin, f"{namespace}.aeq.audit") == str(KEEP_UNTIL_ACKED)

    for future in during:
        future.result(30)
    writer.put("other", "after")

    wait_until(
        lambda: len(recorder.snapshot()) == 2 * _PUTS + 1, 30, "the events after the recreation"
    )
    assert recorder.snapshot()[_PUTS:] == [
        *(("update", "k", 100 + i) for i in range(_PUTS)),
        ("create", "other", "after"),
    ]
    assert server.alive and server.failure is None
    assert writer.get("other") == "after"


def test_an_ops_topic_recreated_elsewhere_is_read_from_its_start(
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    topics = Topics(namespace)
    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})
    recorder = Recorder()
    client_factory().create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    writer = client_factory().create_region("r")
    for i in range(_PUTS):
        writer.put("k", i)
    wait_until(lambda: len(recorder.snapshot()) == _PUTS, 30, "the events before the deletion")
    [ops_spec] = [s for s in server_topic_specs(topics, 16) if s.name == topics.ops]

    # Another server (or an operator) recreates {ns}.ops and operations arrive at once: the
    # new partition passes the server's old read position (the puts and the interest
    # registration) before it reads again, so only a rewind finds them.
    for future in admin.delete_topics([topics.ops], operation_timeout=30).values():
        future.result(timeout=30)
    ensure_topics(admin, [ops_spec])
    ops = [
        entry_operation("app", OperationKind.PUT, "k", seq, b"%d" % (200 + seq))
        for seq in range(2 * _PUTS)
    ]
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers, "linger.ms": 50})
    for op, bucket in ops:  # one record each, delivered together
        producer.produce(topics.ops, encode(op), partition=bucket)
    assert producer.flush(10) == 0

    wait_until(lambda: len(recorder.snapshot()) == 3 * _PUTS, 30, "the new topic's operations")
    assert recorder.snapshot()[_PUTS:] == [("update", "k", 200 + i) for i in range(2 * _PUTS)]
    writer.put("after", 1)
    wait_until(lambda: ("create", "after", 1) in recorder.snapshot(), 30, "a later put")
