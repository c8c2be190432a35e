"""Gateway senders and receivers on a Kafka with SASL/SCRAM and ACLs enforced: two sites
(namespaces) share this module's Kafka, every process logs in as its own user, and each
user holds exactly its set of `regionbus.broker.kafka_acls`. A missing ACL is named where an
operator
looks (the sender's warning, the receiver's start error), and a batch refused for want of
one stays queued until the ACL is granted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from gateway_sites import Site, site_namespaces
from kafka_users import KafkaUsers
from support import wait_until

from regionbus.broker.kafka_acls import (
    KafkaAcl,
    client_acls,
    gateway_receiver_acls,
    gateway_sender_acls,
    gateway_sender_remote_acls,
    server_acls,
)
from regionbus.devstack import KafkaNode
from regionbus.schemas.errors import KafkaAuthorizationError
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.naming import Topics

SENDER = "to-b"


@pytest.fixture(scope="module")
def kafka_users(scram_kafka: KafkaNode) -> KafkaUsers:
    return KafkaUsers(scram_kafka)


@pytest.fixture
def sites(namespace: str, kafka_users: KafkaUsers, redis_url: str) -> Iterator[list[Site]]:
    """Sites A (id 1) and B (id 2), each with a cache server logged in as its own servers'
    user; A queues region ``r`` for sender ``to-b``."""
    with ExitStack() as stack:
        a, b = (
            Site(stack, ns, kafka_users.node.bootstrap_servers, redis_url, site_id)
            for site_id, ns in enumerate(site_namespaces(namespace, 2), start=1)
        )
        for site in (a, b):
            user = f"server-{site.site_id}"
            kafka_users.grant(user, server_acls(site.namespace))
            senders = {SENDER: b.site_id} if site is a else None
            site.start_server(senders, settings_overrides=kafka_users.settings(user))
        yield [a, b]


def _remote_login(kafka_users: KafkaUsers, user: str) -> dict[str, Any]:
    """``remote_kafka_config``: the sender's login on the remote site's Kafka."""
    config = kafka_users.librdkafka(user)
    del config["bootstrap.servers"]
    return config


def _sender_remote_acls(a: Site, b: Site) -> list[KafkaAcl]:
    return gateway_sender_remote_acls(
        a.namespace,
        SENDER,
        site_id=a.site_id,
        remote_namespace=b.namespace,
        remote_receiver_id="receiver",
    )


def _writer(site: Site, kafka_users: KafkaUsers) -> Any:
    """Region ``r`` of a client of ``site``, logged in with a client's ACLs."""
    kafka_users.grant("app", client_acls(site.namespace, "writer"))
    return site.client(**kafka_users.settings("app"), client_id="writer").create_region("r")


def test_a_sender_and_a_receiver_replicate_with_exactly_their_acls(
    sites: list[Site], kafka_users: KafkaUsers
) -> None:
    a, b = sites
    acls = {
        "gw-receiver": gateway_receiver_acls(b.namespace, "receiver"),
        "gw-sender": gateway_sender_acls(a.namespace, SENDER),
        "gw-sender-remote": _sender_remote_acls(a, b),
    }
    for user, granted in acls.items():
        kafka_users.grant(user, granted)
    b.start_receiver(**kafka_users.settings("gw-receiver"))
    a.start_sender(
        SENDER,
        b,
        **kafka_users.settings("gw-sender"),
        remote_kafka_config=_remote_login(kafka_users, "gw-sender-remote"),
    )

    writer = _writer(a, kafka_users)
    writer.put("k", {"v": 1})
    b.wait_for("k", b'{"v":1}')
    writer.put("k", {"v": 2})
    b.wait_for("k", b'{"v":2}')

    for user, granted in acls.items():
        assert kafka_users.granted(user) == set(granted), user
    assert a.senders[SENDER].failure is None
    assert b.receiver is not None and b.receiver.stats.acks_not_sent == 0
    # The acked batches leave the queue topic (DeleteRecords), which Kafka allows with
    # the topic's Delete permission only: without it the queue would grow for ever.
    wait_until(
        lambda: _deleted_records(kafka_users, Topics(a.namespace).gateway(SENDER)) >= 2,
        60,
        "the acknowledged events deleted from the sender's queue",
    )


def _deleted_records(kafka_users: KafkaUsers, topic: str) -> int:
    """Records deleted from the front of ``topic``'s partitions: the sum of their low
    watermarks, read as the admin."""
    consumer = kafka_consumer({**kafka_users.node.client_config(), "group.id": "acl-check"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
            for p in partitions
        )
    finally:
        consumer.close()


def test_a_sender_refused_the_remote_inbound_topic_keeps_the_batch_names_the_acl_and_resumes(
    sites: list[Site], kafka_users: KafkaUsers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="regionbus.gateways.sender")
    a, b = sites
    inbound = Topics(b.namespace).gateway_inbound("receiver")
    write_inbound = KafkaAcl("topic", inbound, "literal", "Write")
    remote = _sender_remote_acls(a, b)
    assert write_inbound in remote
    kafka_users.grant("gw-receiver-2", gateway_receiver_acls(b.namespace, "receiver"))
    kafka_users.grant("gw-sender-2", gateway_sender_acls(a.namespace, SENDER))
    kafka_users.grant("gw-sender-remote-2", [acl for acl in remote if acl != write_inbound])
    b.start_receiver(**kafka_users.settings("gw-receiver-2"))
    sender = a.start_sender(
        SENDER,
        b,
        **kafka_users.settings("gw-sender-2"),
        remote_kafka_config=_remote_login(kafka_users, "gw-sender-remote-2"),
        retry_interval_ms=200,
    )

    _writer(a, kafka_users).put("k", "waits for the ACL")
    wait_until(lambda: sender.stats.unreachable_retries >= 2, what="the sender to retry")
    warnings = [r.getMessage() for r in caplog.records]
    assert any(
        "TOPIC_AUTHORIZATION_FAILED" in line and f"topic {inbound}" in line for line in warnings
    ), warnings
    assert "k" not in b.entries()
    assert sender.failure is None and sender.alive

    kafka_users.grant("gw-sender-remote-2", [write_inbound])
    b.wait_for("k", b'"waits for the ACL"')


def test_a_receiver_refused_its_inbound_topic_does_not_start_and_says_which(
    sites: list[Site], kafka_users: KafkaUsers
) -> None:
    _, b = sites
    inbound = Topics(b.namespace).gateway_inbound("receiver")
    create_inbound = KafkaAcl("topic", inbound, "literal", "Create")
    acls = gateway_receiver_acls(b.namespace, "receiver")
    assert create_inbound in acls
    kafka_users.grant("gw-receiver-3", [acl for acl in acls if acl != create_inbound])
    with pytest.raises(KafkaAuthorizationError) as refused:
        b.start_receiver(**kafka_users.settings("gw-receiver-3"))
    assert refused.value.resource == f"topic {inbound}"
