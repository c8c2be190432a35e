"""Entry expiration with security on (docs/behaviour.md §1, docs/security.md): the servers' own
expirations are signed and applied, and one sent by a client principal, even one holding every
permission, is refused, audited and dead-lettered, and changes nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kafka_users import KafkaUsers
from support import wait_until
from test_expiration import _Events
from test_security import (
    RAW_USER,
    SECRETS,
    _audit_lines,
    _client,
    _dead_letter_reasons,
    _perms,
    _RawSender,
    _signed,
    client_factory,  # noqa: F401  (a fixture of that module, used here)
    kafka_users,  # noqa: F401
    secured_settings,
)

from regionbus.broker.expiration_attributes import (
    ExpirationAction,
    ExpirationAttributes,
    RegionExpiration,
)
from regionbus.broker.kafka_acls import client_acls
from regionbus.broker.principals import PrincipalStore
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.schemas.codec import encode
from regionbus.schemas.errors import NotAuthorizedError, error_from_wire
from regionbus.schemas.eventid import EXPIRY_MEMBER, EXPIRY_THREAD, EventID
from regionbus.schemas.messages import EventKind, Operation, OperationKind
from regionbus.schemas.naming import bucket_of

_ADMIN_SECRET = "admin-secret"


@pytest.fixture
def expiring_secured_server(
    namespace: str,
    kafka_users: KafkaUsers,  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
) -> Iterator[CacheServer]:
    """A secured server whose region ``r`` destroys entries 3 s after their last write;
    principals ``writer`` (read and write ``r``) and ``admin`` (every permission)."""
    store = PrincipalStore(redis_client, namespace)
    store.add("writer", SECRETS["writer"], _perms("DATA:READ:r", "DATA:WRITE:r"))
    store.add("admin", _ADMIN_SECRET, _perms("*:*"))
    ttl = ExpirationAttributes(timeout_s=3, action=ExpirationAction.DESTROY)
    settings = secured_settings(namespace, kafka_users, redis_url).model_copy(
        update={
            "regions": ["r"],
            "region_expiration": {"r": RegionExpiration(entry_time_to_live=ttl)},
            "expiration_interval_ms": 50,
        }
    )
    server = CacheServer(settings)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_servers_expire_signed_and_refuse_an_expiration_from_an_all_powerful_principal(
    expiring_secured_server: CacheServer,
    client_factory: Any,  # noqa: F811
    kafka_users: KafkaUsers,  # noqa: F811
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="regionbus.audit")
    server = expiring_secured_server
    heard = _Events()
    region = _client(client_factory, "writer").create_region("r", listeners=[heard])
    region.register_interest(ALL_KEYS)
    region.put("k", "v")
    bucket = bucket_of("r", "k", 16)
    at_ms = server.store.redis.zscore(server.store.keys.region_expiry("r", bucket), "k")
    assert at_ms is not None
    kafka_users.grant(RAW_USER, client_acls(namespace, "raw-client", RAW_USER))
    sender = _RawSender(kafka_users.librdkafka(RAW_USER), namespace, "raw-client", RAW_USER)
    try:
        forged = Operation(
            request_id=9,
            client_id="raw-client",
            kind=OperationKind.EXPIRE_DESTROY,
            region="r",
            timestamp_ms=int(at_ms),
            event_id=EventID(EXPIRY_MEMBER, EXPIRY_THREAD, 1, bucket),
            key="k",
            kafka_principal=RAW_USER,
        )
        value = encode(forged)
        ops = sender.topics.ops
        sender.send(value, bucket, _signed("admin", _ADMIN_SECRET, namespace, ops, bucket, value))
        reply = sender.reply(9)
    finally:
        sender.close()

    assert not reply.ok
    error = error_from_wire(reply.error_type, reply.error_message)
    assert isinstance(error, NotAuthorizedError) and "bucket primaries only" in str(error)
    assert any("principal=admin operation=EXPIRE_DESTROY" in line for line in _audit_lines(caplog))
    assert any("bucket primaries only" in r for r in _dead_letter_reasons(kafka_users, namespace))
    assert "k" in server.store.entries("r")  # refused well before its time
    assert time.time() * 1000 < at_ms, "the test was too slow to tell a refusal from expiry"
    wait_until(lambda: (EventKind.DESTROY, True) in heard.of("k"), 20, "the servers' expiry")
    assert heard.of("k") == [(EventKind.CREATE, False), (EventKind.DESTROY, True)]
    assert server.stats.entries_expired == 1
