"""`regionbus.schemas.transport.kafka_error`: confluent-kafka's errors become regionbus's, an ACL
refusal a `KafkaAuthorizationError` naming what was refused."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from regionbus.schemas.errors import (
    AuthenticationError,
    KafkaAuthorizationError,
    NotAuthorizedError,
    TransportError,
)
from regionbus.schemas.transport import is_authorization_error, kafka_error


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "topic"),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, "group"),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "cluster"),
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactional id"),
    ],
)
def test_an_authorization_failure_is_a_non_retriable_kafka_authorization_error(
    code: int, kind: str
) -> None:
    for raised in (KafkaError(code), KafkaException(KafkaError(code))):
        error = kafka_error(raised, "producing to ns.ops")
        assert isinstance(error, KafkaAuthorizationError)
        assert isinstance(error, NotAuthorizedError) and not error.retriable
        assert error.resource == kind
        assert error.kafka_error == KafkaError(code).name()
        assert str(error).startswith("producing to ns.ops: Kafka refused it")
        assert "regionbus kafka-acls" in str(error)
        assert is_authorization_error(raised)


def test_the_named_resource_is_kept() -> None:
    error = kafka_error(
        KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "reading", "topic ns.reply.a"
    )
    assert isinstance(error, KafkaAuthorizationError)
    assert error.resource == "topic ns.reply.a"
    assert "no ACL for topic ns.reply.a" in str(error)


@pytest.mark.parametrize(
    "code", [KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION]
)
def test_a_failed_login_is_an_authentication_error(code: int) -> None:
    assert isinstance(kafka_error(KafkaError(code), "connecting"), AuthenticationError)


@pytest.mark.parametrize(
    "code", [KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.UNKNOWN_TOPIC_OR_PART]
)
def test_anything_else_is_a_retriable_transport_error(code: int) -> None:
    error = kafka_error(KafkaException(KafkaError(code)), "metadata")
    assert type(error) is TransportError and error.retriable
    assert not is_authorization_error(KafkaError(code))
