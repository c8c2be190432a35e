"""The servers own the shared client topics: whatever a client (or anyone) made them with,
and whatever timeout a durable client asks for, no client decides what another's queue
keeps, and no topic's refusal holds the others back.

- The servers check each principal's queue and reply topics on every connect, and their
  own topics at start, on the configs the brokers hold, and set back what would lose or
  refuse records.
- A durable-client timeout above the servers' bound is refused.
- A durable client whose queue lost records it had not read says so (``EVENTS_LOST``).
- A record one client topic refuses is dead-lettered for its recipients; the server
  commits past it and the other clients go on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from support import Recorder, dead_letters, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.outbox import RECIPIENT_HEADER
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.messages import CLIENT_EVENTS_LOST, CLIENT_RECONNECTED
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_limits import RECORD_BATCH_MAX_BYTES
from regionbus.schemas.topics import DEFAULT_QUEUE_RETENTION_MS, REPLY_RETENTION_MS

pytestmark = pytest.mark.abuse

_LOSING_CONFIGS = {
    "retention.ms": "1000",
    "retention.bytes": "1000",
    "max.message.bytes": "200",
    "cleanup.policy": "compact",
}
"""What a careless or hostile first client of a principal might make its topics with."""


@pytest.fixture
def admin(kafka_bootstrap_servers: str) -> AdminClient:
    return kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})


def _configs(admin: AdminClient, topic: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    (future,) = admin.describe_configs([resource], request_timeout=10).values()
    return {name: entry.value for name, entry in future.result(timeout=10).items()}


def _create(admin: AdminClient, topics: list[str], partitions: int) -> None:
    made = admin.create_topics(
        [NewTopic(t, partitions, 1, config=dict(_LOSING_CONFIGS)) for t in topics]
    )
    for future in made.values():
        future.result(timeout=30)


def _keeps_everything(admin: AdminClient, topic: str, retention_ms: int) -> None:
    """Wait until the brokers report the topic keeping every record (an alter reaches the
    brokers' metadata a moment after it is acknowledged)."""

    def keeps() -> bool:
        configs = _configs(admin, topic)
        return (
            configs["cleanup.policy"] == "delete"
            and int(configs["retention.ms"]) >= retention_ms
            and configs["retention.bytes"] == "-1"
            and int(configs["max.message.bytes"]) >= RECORD_BATCH_MAX_BYTES
        )

    wait_until(keeps, timeout_s=10, what=f"{topic} to keep every record")


def test_a_principals_shared_topics_made_to_lose_records_are_set_back_at_a_clients_connect(
    cache_server: CacheServer,
    client_factory: Callable[..., ClientCache],
    admin: AdminClient,
    namespace: str,
) -> None:
    topics = Topics(namespace)
    queues, replies = topics.client_queues("desk"), topics.client_replies("desk")
    _create(admin, [queues, replies], partitions=4)

    durable = client_factory(kafka_principal="desk", durable_client_id="d1")
    durable.create_region("r").register_interest(ALL_KEYS, durable=True)
    durable.ready_for_events()

    _keeps_everything(admin, queues, DEFAULT_QUEUE_RETENTION_MS)
    _keeps_everything(admin, replies, REPLY_RETENTION_MS)
    durable.close(keep_alive=True)
    writer = client_factory().create_region("r")
    writer.put_all({f"k{i}": "x" * 300 for i in range(50)})
    again = client_factory(kafka_principal="desk", durable_client_id="d1")
    assert again.client_state == CLIENT_RECONNECTED
    assert again.pending_event_count == 50


def test_the_servers_set_back_their_own_topics_at_start(
    server_settings: ServerSettings, admin: AdminClient, namespace: str
) -> None:
    topics = Topics(namespace)
    _create(admin, [topics.client_queues(None), topics.ops], partitions=16)
    with CacheServer(server_settings):
        _keeps_everything(admin, topics.client_queues(None), DEFAULT_QUEUE_RETENTION_MS)
        _keeps_everything(admin, topics.ops, 0)


def test_a_durable_client_timeout_above_the_servers_bound_is_refused_and_changes_no_topic(
    server_settings: ServerSettings,
    client_factory: Callable[..., ClientCache],
    admin: AdminClient,
    namespace: str,
) -> None:
    bounded = server_settings.model_copy(update={"max_durable_client_timeout_s": 3600})
    with CacheServer(bounded):
        queues = Topics(namespace).client_queues(None)
        before = _configs(admin, queues)["retention.ms"]
        with pytest.raises(ConfigurationError, match="max_durable_client_timeout_s"):
            client_factory(durable_client_id="forever", durable_client_timeout_s=2**31 - 1)
        assert _configs(admin, queues)["retention.ms"] == before
        within = client_factory(durable_client_id="hour", durable_client_timeout_s=3600)
        assert within.client_state == "NEW"


@pytest.fixture
def durable_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    with CacheServer(server_settings) as server:
        yield server


def test_a_durable_client_whose_queue_lost_unread_records_says_events_lost(
    durable_server: CacheServer,
    client_factory: Callable[..., ClientCache],
    admin: AdminClient,
) -> None:
    durable = client_factory(durable_client_id="desk")
    durable.create_region("r").register_interest(ALL_KEYS, durable=True)
    durable.ready_for_events()
    address = durable.pool.address
    durable.close(keep_alive=True)
    writer = client_factory().create_region("r")
    for i in range(20):
        writer.put(f"k{i}", i)
    queue = TopicPartition(address.queue_topic, address.queue_partition)
    wait_until(
        lambda: admin.list_offsets({queue: OffsetSpec.latest()})[queue].result(10).offset > 0,
        what="the events in the queue",
    )
    # What retention does to a queue whose client stays away too long.
    end = admin.list_offsets({queue: OffsetSpec.latest()})[queue].result(10).offset
    deleted = admin.delete_records([TopicPartition(queue.topic, queue.partition, end)])
    for future in deleted.values():
        future.result(timeout=10)
    writer.put("after", 1)

    again = client_factory(durable_client_id="desk")
    assert again.client_state == CLIENT_EVENTS_LOST
    assert again.lost_queue_records >= 1
    heard = Recorder()
    again.create_region("r", listeners=[heard])
    again.ready_for_events()
    wait_until(lambda: ("create", "after", 1) in heard.snapshot(), what="what the queue kept")


def test_a_record_one_clients_topic_refuses_is_dead_lettered_for_it_and_the_others_go_on(
    cache_server: CacheServer,
    client_factory: Callable[..., ClientCache],
    admin: AdminClient,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    refusing = client_factory(kafka_principal="narrow")
    refusing.create_region("r").register_interest(ALL_KEYS)
    others = Recorder()
    client_factory().create_region("r", listeners=[others]).register_interest(ALL_KEYS)
    # After the connect's check: an operator (or a client allowed to) narrows the topic.
    narrowed = ConfigResource(ResourceType.TOPIC, Topics(namespace).client_queues("narrow"))
    narrowed.add_incremental_config(
        ConfigEntry("max.message.bytes", "200", incremental_operation=AlterConfigOpType.SET)
    )
    for future in admin.incremental_alter_configs([narrowed]).values():
        future.result(timeout=10)

    writer = client_factory().create_region("r")
    for i in range(5):
        writer.put(f"big{i}", "x" * 1000)
    wait_until(lambda: len(others.snapshot()) == 5, what="the other client's events")
    refused = [
        headers
        for _, headers in dead_letters(kafka_bootstrap_servers, namespace)
        if headers.get(RECIPIENT_HEADER) == refusing.client_id.encode()
    ]
    assert refused, "no dead letter for the refusing topic's client"
    assert cache_server.stats.dead_letters_by_category.get("refused_by_recipient_topic", 0) >= 1
    parts = cache_server._parts
    assert parts is not None
    assert parts.outbox.delivery_failures == 0, "the refusal held the bucket back"
    writer.put("later", "y")
    wait_until(lambda: ("create", "later", "y") in others.snapshot(), what="a later event")
    assert len([c for c in others.snapshot() if c[1].startswith("big")]) == 5, "sent twice"
