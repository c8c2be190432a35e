"""Kafka over TLS: a node of this module listens with SASL_SSL only (a test CA made here,
the broker's key and certificate read as PEM), with SCRAM logins and ACLs enforced. A server
and clients with their `regionbus.broker.kafka_acls` work over it; a client that does not trust the
CA,
or speaks SASL without TLS, does not get in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka_users import KafkaUsers
from pki import make_test_pki
from support import Recorder, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.kafka_acls import client_acls, server_acls
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache, ClientSettings
from regionbus.devstack import KafkaNode, ScramSecurity
from regionbus.schemas.errors import TransportError

SERVER_USER = "regionbus-server"


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    files = make_test_pki(tmp_path_factory.mktemp("kafka-pki"))
    security = ScramSecurity("admin", "admin-scram-secret", tls=files)
    with KafkaNode(security=security, heap_max_mb=512) as node:
        yield node


@pytest.fixture(scope="module")
def kafka_users(tls_kafka: KafkaNode) -> KafkaUsers:
    return KafkaUsers(tls_kafka)


@pytest.fixture
def server(namespace: str, kafka_users: KafkaUsers, redis_url: str) -> Iterator[CacheServer]:
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


def _client(
    kafka_users: KafkaUsers, namespace: str, user: str, client_id: str, **overrides: Any
) -> ClientCache:
    kafka_users.grant(user, client_acls(namespace, client_id))
    fields: dict[str, Any] = {
        "namespace": namespace,
        **kafka_users.settings(user),
        "client_id": client_id,
        "fetch_wait_max_ms": 20,
        "read_timeout_ms": 30_000,
    }
    fields.update(overrides)
    return ClientCache(ClientSettings(**fields))


def test_a_server_and_clients_with_their_acls_work_over_sasl_ssl(
    server: CacheServer, kafka_users: KafkaUsers, namespace: str, tls_kafka: KafkaNode
) -> None:
    assert kafka_users.settings(SERVER_USER)["kafka_security_protocol"] == "SASL_SSL"
    recorder = Recorder()
    reader = _client(kafka_users, namespace, "app-reader", "reader")
    writer = _client(kafka_users, namespace, "app-writer", "writer")
    try:
        reader.create_region("r", listeners=[recorder]).register_interest("ALL_KEYS")
        region = writer.create_region("r")
        region.put("k", {"over": "tls"})
        assert region.get("k") == {"over": "tls"}
        wait_until(lambda: ("create", "k", {"over": "tls"}) in recorder.snapshot(), what="event")
    finally:
        writer.close()
        reader.close()
    assert "listeners=SASL_SSL://" in (tls_kafka.work_dir / "server.properties").read_text()


@pytest.mark.parametrize(
    "login",
    [
        pytest.param({"kafka_ssl_ca_location": None}, id="without-the-test-ca"),
        pytest.param(
            {"kafka_ssl_ca_location": None, "kafka_security_protocol": "SASL_PLAINTEXT"},
            id="without-tls",
        ),
    ],
)
def test_a_client_that_does_not_verify_the_broker_over_tls_does_not_get_in(
    server: CacheServer, kafka_users: KafkaUsers, namespace: str, login: dict[str, Any]
) -> None:
    with pytest.raises(TransportError):
        _client(kafka_users, namespace, "app-outsider", "outsider", metadata_timeout_s=3, **login)
