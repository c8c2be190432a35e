"""A Spark bulk load on a Kafka with SASL/SCRAM and ACLs enforced: the bulk-load user with
exactly `regionbus.broker.kafka_acls.bulk_load_acls` loads (and loads again, recognised as
duplicates), and one without Write on ``{ns}.ops`` or outside its load-id prefix gets a
`KafkaAuthorizationError` naming the topic, not a Spark stack trace or a hang."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError
from kafka_users import KafkaUsers

from regionbus.broker.config import ServerSettings
from regionbus.broker.kafka_acls import KafkaAcl, bulk_load_acls, server_acls
from regionbus.broker.server import CacheServer
from regionbus.devstack import KafkaNode
from regionbus.schemas.errors import KafkaAuthorizationError
from regionbus.schemas.naming import Topics, bucket_of
from regionbus.spark import kafka as spark_kafka
from regionbus.spark.bulkload import bulk_load

SERVER_USER = "regionbus-server"


@pytest.fixture(scope="module")
def kafka_users(scram_kafka: KafkaNode) -> KafkaUsers:
    return KafkaUsers(scram_kafka)


@pytest.fixture
def server(namespace: str, kafka_users: KafkaUsers, redis_url: str) -> Iterator[CacheServer]:
    """A cache server of region ``r`` with the servers' user and ACLs (security off: the
    bulk loader does not sign, docs/security.md)."""
    kafka_users.grant(SERVER_USER, server_acls(namespace))
    settings = ServerSettings(
        namespace=namespace,
        **kafka_users.settings(SERVER_USER),
        redis_url=redis_url,
        regions=["r"],
        fetch_wait_max_ms=20,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
    )
    with CacheServer(settings) as started:
        yield started


def _entries(spark: Any, count: int) -> Any:
    return spark.range(count).selectExpr("concat('item-', id) AS key", "id AS value")


def _load(spark: Any, kafka_users: KafkaUsers, user: str, namespace: str, **options: Any) -> Any:
    config = kafka_users.librdkafka(user)
    return bulk_load(
        spark,
        _entries(spark, 200).repartition(2),
        "r",
        kafka_bootstrap_servers=config.pop("bootstrap.servers"),
        kafka_config=config,
        namespace=namespace,
        wait_applied_timeout_s=120,
        **options,
    )


def test_a_bulk_load_user_with_exactly_its_acls_loads_and_reloads(
    spark_session: Any, server: CacheServer, kafka_users: KafkaUsers, namespace: str
) -> None:
    acls = bulk_load_acls(namespace, "loader")
    kafka_users.grant("loader", acls)

    first = _load(spark_session, kafka_users, "loader", namespace)
    again = _load(spark_session, kafka_users, "loader", namespace, load_id=first.load_id)

    assert first.ok and (first.applied, first.duplicates) == (200, 0), first
    assert again.ok and (again.applied, again.duplicates) == (0, 200), again
    assert server.store.get("r", "item-7", _bucket(server, "item-7"))[1] is not None
    assert kafka_users.granted("loader") == set(acls)


def _bucket(server: CacheServer, key: str) -> int:
    return bucket_of("r", key, server.settings.total_buckets)


def test_a_bulk_load_user_without_write_on_ops_is_refused_with_the_topic_named(
    spark_session: Any, server: CacheServer, kafka_users: KafkaUsers, namespace: str
) -> None:
    ops = Topics(namespace).ops
    write_ops = KafkaAcl("topic", ops, "literal", "Write")
    acls = bulk_load_acls(namespace, "loader-no-write")
    assert write_ops in acls
    kafka_users.grant("loader-no-write", [acl for acl in acls if acl != write_ops])

    with pytest.raises(KafkaAuthorizationError) as refused:
        _load(spark_session, kafka_users, "loader-no-write", namespace)
    assert refused.value.resource == f"topic {ops}"


def test_a_load_naming_another_users_reply_topic_is_refused_with_that_topic_named(
    spark_session: Any, server: CacheServer, kafka_users: KafkaUsers, namespace: str
) -> None:
    kafka_users.grant("loader-own", bulk_load_acls(namespace, "loader-own"))

    with pytest.raises(KafkaAuthorizationError) as refused:
        _load(spark_session, kafka_users, "loader-own", namespace, kafka_principal="loader")
    assert refused.value.resource == f"topic {Topics(namespace).client_replies('loader')}"


def test_the_spark_sinks_producer_refused_every_write_fails_with_a_typed_error(
    server: CacheServer, kafka_users: KafkaUsers, namespace: str
) -> None:
    # Only Describe: the idempotent producer cannot even get its producer id (Kafka wants
    # Write on some topic or IdempotentWrite), which confluent-kafka reports as fatal.
    ops = Topics(namespace).ops
    kafka_users.grant("sink-no-write", [KafkaAcl("topic", ops, "literal", "Describe")])
    config = kafka_users.librdkafka("sink-no-write")
    producer = spark_kafka.producer(config)
    failures: list[tuple[str, KafkaError]] = []
    spark_kafka.produce(producer, ops, b"never stored", None, 0, None, failures)

    with pytest.raises(KafkaAuthorizationError) as refused:
        spark_kafka.flush(producer, failures, 30)
    assert refused.value.kafka_error == "CLUSTER_AUTHORIZATION_FAILED"
