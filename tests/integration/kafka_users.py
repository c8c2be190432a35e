"""SCRAM users and their ACLs on a secured Kafka node of a test module, and the settings
that make a server, client or worker log in as one of them."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from regionbus.broker.kafka_acls import KafkaAcl, grant, granted, revoke
from regionbus.devstack import KafkaNode
from regionbus.devstack.kafka_broker import SCRAM_MECHANISM, add_scram_users
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer


class KafkaUsers:
    """The users of one secured node; each is created (SCRAM-SHA-512) on first use.

    Args:
        node: A running `KafkaNode` with `ScramSecurity`.
    """

    def __init__(self, node: KafkaNode) -> None:
        assert node.security is not None
        self.node = node
        self.security = node.security
        self.admin = kafka_admin(node.client_config())
        self._created: set[str] = set()

    @staticmethod
    def password(user: str) -> str:
        """The test password of ``user``."""
        return f"{user}-scram-secret"

    def _ensure(self, user: str) -> None:
        if user not in self._created:
            add_scram_users(self.node.client_config(), {user: self.password(user)})
            self._created.add(user)

    def librdkafka(self, user: str) -> dict[str, str]:
        """librdkafka keys (bootstrap servers included) of a client logged in as ``user``."""
        self._ensure(user)
        return {
            "bootstrap.servers": self.node.bootstrap_servers,
            **self.security.client_config(user, self.password(user)),
        }

    def settings(self, user: str) -> dict[str, Any]:
        """The typed ``kafka_*`` settings fields of a process logged in as ``user``."""
        self._ensure(user)
        fields: dict[str, Any] = {
            "kafka_bootstrap_servers": self.node.bootstrap_servers,
            "kafka_security_protocol": self.security.protocol,
            "kafka_sasl_mechanism": SCRAM_MECHANISM,
            "kafka_sasl_username": user,
            "kafka_sasl_password": self.password(user),
        }
        if self.security.tls is not None:
            fields["kafka_ssl_ca_location"] = self.security.tls.ca_cert
        return fields

    def grant(self, user: str, acls: Iterable[KafkaAcl]) -> None:
        """Give ``user`` these ACLs (created if new) once the broker enforces them."""
        self._ensure(user)
        grant(self.admin, user, acls)

    def revoke(self, user: str, acls: Iterable[KafkaAcl]) -> None:
        """Take these ACLs from ``user`` once the broker no longer enforces them."""
        revoke(self.admin, user, acls)

    def granted(self, user: str) -> set[KafkaAcl]:
        """Every ACL ``user`` holds."""
        return granted(self.admin, user)

    def topic_names(self) -> set[str]:
        """Every topic of the node (as the admin sees them)."""
        return set(self.admin.list_topics(timeout=10).topics)

    def read(self, topic: str, user: str | None = None, timeout_s: float = 10.0) -> list[Any]:
        """Every message of partition 0 of ``topic``, read to its end as ``user`` (the
        admin when None); error events other than the end of the partition included."""
        config = self.node.client_config() if user is None else self.librdkafka(user)
        consumer = kafka_consumer(
            {
                **config,
                "group.id": f"probe-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is None:
                    continue
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    break
                out.append(message)
        finally:
            consumer.close()
        return out
