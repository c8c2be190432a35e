"""Security against real Kafka and Redis: signed requests, per-region authorization,
refusals (typed error, audit line, dead letter, nothing applied) and routing only to readers.

The Kafka is this module's own, with SASL/SCRAM and ACLs enforced: the server logs in with
the servers' ACLs and each client application as its own Kafka user holding only the ACLs
of its client ids (`regionbus.broker.kafka_acls`), as in the ``secured`` compose profile.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from confluent_kafka import TopicPartition
from kafka_users import KafkaUsers
from support import Recorder, settle, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.kafka_acls import client_acls, server_acls
from regionbus.broker.permissions import ResourcePermission
from regionbus.broker.principals import PrincipalStore
from regionbus.broker.server import CacheServer
from regionbus.broker.store import RegionStore
from regionbus.clients import ClientCache, ClientSettings
from regionbus.devstack import KafkaNode
from regionbus.schemas.codec import decode, encode, split_batch
from regionbus.schemas.errors import AuthenticationError, NotAuthorizedError, error_from_wire
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.messages import Event, EventKind, Operation, OperationKind, Reply
from regionbus.schemas.naming import Topics, bucket_of, client_partition
from regionbus.schemas.signing import SERVER_PRINCIPAL, Signer
from regionbus.schemas.topics import client_topic_specs, ensure_topics
from regionbus.schemas.transport import topic_partitions

ClientFactory = Callable[..., Any]
TEST_FETCH_WAIT_MAX_MS = 100

SECRETS = {"writer": "writer-secret", "reader": "reader-secret", "nosy": "nosy-secret"}
SERVER_USER = "regionbus-server"
RAW_USER = "raw-sender"
"""Kafka user of the hand-made client below (regionbus principals are its headers')."""


@pytest.fixture(scope="module")
def kafka_users(scram_kafka: KafkaNode) -> KafkaUsers:
    return KafkaUsers(scram_kafka)


def _perms(*texts: str) -> list[ResourcePermission]:
    return [ResourcePermission.parse(t) for t in texts]


@pytest.fixture
def principals(redis_client: redis.Redis, namespace: str) -> PrincipalStore:
    """writer: read+write r and s; reader: read r only; nosy: read s, write r."""
    store = PrincipalStore(redis_client, namespace)
    store.add("writer", SECRETS["writer"], _perms("DATA:READ:r", "DATA:WRITE:r", "DATA:*:s"))
    store.add("reader", SECRETS["reader"], _perms("DATA:READ:r"))
    store.add("nosy", SECRETS["nosy"], _perms("DATA:READ:s", "DATA:WRITE:r"))
    return store


def secured_settings(namespace: str, kafka_users: KafkaUsers, redis_url: str) -> ServerSettings:
    """Settings of a cache server with security on, regions r and s, logged in to Kafka as
    the servers' user, granted the servers' ACLs of the namespace."""
    kafka_users.grant(SERVER_USER, server_acls(namespace))
    return ServerSettings(
        namespace=namespace,
        **kafka_users.settings(SERVER_USER),
        redis_url=redis_url,
        regions=["r", "s"],
        fetch_wait_max_ms=TEST_FETCH_WAIT_MAX_MS,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
        security_enabled=True,
        allowed_skew_ms=60_000,
        principal_cache_ttl_ms=200,
    )


@pytest.fixture
def secured_server(
    namespace: str, kafka_users: KafkaUsers, redis_url: str, principals: PrincipalStore
) -> Iterator[CacheServer]:
    """A cache server with security on, regions r and s, logged in to Kafka as the servers'
    user with the servers' ACLs of the namespace."""
    server = CacheServer(secured_settings(namespace, kafka_users, redis_url))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client_factory(namespace: str, kafka_users: KafkaUsers) -> Iterator[ClientFactory]:
    """Makes client caches of this test's namespace logged in to Kafka as the user named by
    ``kafka_user``, each with a client id of its own that the user gets the ACLs of."""
    made: list[ClientCache] = []
    numbers = itertools.count(1)

    def make(kafka_user: str, **overrides: Any) -> ClientCache:
        client_id = overrides.pop("client_id", f"{kafka_user}-{next(numbers)}")
        kafka_users.grant(kafka_user, client_acls(namespace, client_id, kafka_user))
        settings: dict[str, Any] = {
            "namespace": namespace,
            **kafka_users.settings(kafka_user),
            "client_id": client_id,
            "fetch_wait_max_ms": TEST_FETCH_WAIT_MAX_MS,
            "read_timeout_ms": 15_000,
        }
        settings.update(overrides)
        cache = ClientCache(ClientSettings(**settings))
        made.append(cache)
        return cache

    try:
        yield make
    finally:
        for cache in made:
            cache.close()


def _client(factory: ClientFactory, principal: str, secret: str | None = None) -> Any:
    """A client of the regionbus ``principal``, logged in to Kafka as a user of that name."""
    return factory(
        principal, security_principal=principal, security_secret=secret or SECRETS[principal]
    )


def _stored(redis_client: redis.Redis, namespace: str, region: str, key: str) -> Any:
    store = RegionStore(redis_client, namespace, 16)
    exists, entry = store.get(region, key, bucket_of(region, key, 16))
    assert exists
    return None if entry is None else entry.value


def _audit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "regionbus.audit"]


def _topic_values(
    users: KafkaUsers, topic: str, partition: int = 0, key: bytes | None = None
) -> list[tuple[bytes, dict[str, bytes]]]:
    """Every message of one partition of a topic (only those keyed ``key``, if given), read
    to its end by the Kafka admin."""
    out: list[tuple[bytes, dict[str, bytes]]] = []
    for message in users.read(topic, partition=partition):
        if message.error() is None and (key is None or message.key() == key):
            headers = {k: v for k, v in (message.headers() or []) if isinstance(v, bytes)}
            out.append((message.value() or b"", headers))
    return out


def _dead_letter_reasons(users: KafkaUsers, namespace: str) -> list[str]:
    return [
        h.get("rb.reason", b"").decode()
        for _, h in _topic_values(users, Topics(namespace).dead_letter)
    ]


# --- authorization ---------------------------------------------------------------------


def test_client_without_data_write_is_refused_put_destroy_and_clear_and_nothing_changes(
    secured_server: CacheServer,
    client_factory: ClientFactory,
    redis_client: redis.Redis,
    namespace: str,
    kafka_users: KafkaUsers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="regionbus.audit")
    writer_cache = _client(client_factory, "writer")
    writer = writer_cache.create_region("r")
    writer.put("k", {"v": 1})
    observer_cache = _client(client_factory, "writer")
    recorder = Recorder()
    observer = observer_cache.create_region("r", listeners=[recorder])
    observer.register_interest("ALL_KEYS")
    reader = _client(client_factory, "reader").create_region("r")
    assert reader.get("k") == {"v": 1}

    with pytest.raises(NotAuthorizedError, match="DATA:WRITE:r"):
        reader.put("k", {"v": 2})
    with pytest.raises(NotAuthorizedError):
        reader.put("new", {"v": 3})
    with pytest.raises(NotAuthorizedError):
        reader.destroy("k")
    with pytest.raises(NotAuthorizedError, match="DATA:WRITE:r"):
        reader.clear()

    assert _stored(redis_client, namespace, "r", "k") == b'{"v":1}'
    store = RegionStore(redis_client, namespace, 16)
    assert store.get("r", "new", bucket_of("r", "new", 16)) == (True, None)
    writer.put("fence", 1)
    wait_until(lambda: ("create", "fence", 1) in recorder.snapshot(), what="fence event")
    assert [c for c in recorder.snapshot() if c[1] != "fence"] == []
    assert observer.get("k") == {"v": 1}
    refused = _audit_lines(caplog)
    assert any("principal=reader operation=PUT region=r" in line for line in refused)
    assert any("principal=reader operation=DESTROY region=r" in line for line in refused)
    assert any("principal=reader operation=CLEAR region=r" in line for line in refused)
    wait_until(
        lambda: (
            sum("NotAuthorizedError" in r for r in _dead_letter_reasons(kafka_users, namespace))
            >= 4
        ),
        what="four dead letters",
    )


def test_client_without_data_read_cannot_register_or_get_and_gets_no_event_of_the_region(
    secured_server: CacheServer,
    client_factory: ClientFactory,
    namespace: str,
    kafka_users: KafkaUsers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="regionbus.audit")
    writer_cache = _client(client_factory, "writer")
    r_writer, s_writer = writer_cache.create_region("r"), writer_cache.create_region("s")
    r_writer.put("k", "secret")
    nosy_cache = _client(client_factory, "nosy")
    nosy_r = nosy_cache.create_region("r")
    nosy_s = nosy_cache.create_region("s", listeners=[Recorder()])

    with pytest.raises(NotAuthorizedError, match="DATA:READ:r"):
        nosy_r.register_interest("ALL_KEYS")
    with pytest.raises(NotAuthorizedError, match="DATA:READ:r:k"):
        nosy_r.register_interest(["k"])
    with pytest.raises(NotAuthorizedError, match="DATA:READ:r"):
        nosy_r.get("k")
    nosy_s.register_interest("ALL_KEYS")
    nosy_r.put("by-nosy", "write is allowed")  # DATA:WRITE:r, and it is applied

    for i in range(20):
        r_writer.put(f"r{i}", i)
        s_writer.put(f"s{i}", i)
    r_writer.clear()
    wait_until(lambda: nosy_s.get("s19") == 19, what="s events at nosy")
    settle(nosy_cache)

    regions = set()
    nosy = nosy_cache.pool.address
    for value, _ in _topic_values(kafka_users, nosy.queue_topic, nosy.queue_partition, nosy.key):
        for raw in split_batch(value):
            message = decode(raw)
            if isinstance(message, Event):
                regions.add(message.region)
    assert regions == {"s"}
    assert any(
        "principal=nosy operation=REGISTER_INTEREST region=r" in line
        for line in _audit_lines(caplog)
    )


def test_events_stop_reaching_a_client_whose_read_permission_was_revoked(
    secured_server: CacheServer,
    client_factory: ClientFactory,
    principals: PrincipalStore,
) -> None:
    writer = _client(client_factory, "writer").create_region("r")
    recorder = Recorder()
    reader_region = _client(client_factory, "reader").create_region("r", listeners=[recorder])
    reader_region.register_interest("ALL_KEYS")
    writer.put("before", 1)
    wait_until(lambda: ("create", "before", 1) in recorder.snapshot(), what="event before")

    principals.add("reader", SECRETS["reader"], _perms("DATA:READ:s"))
    time.sleep(0.5)  # > principal_cache_ttl_ms of the server
    for i in range(10):
        writer.put(f"after{i}", i)
    writer.put("after9", "last")
    time.sleep(1.0)
    assert [c for c in recorder.snapshot() if c[1].startswith("after")] == []


# --- authentication --------------------------------------------------------------------


def test_a_client_with_a_wrong_secret_is_refused_at_connect(
    secured_server: CacheServer,
    client_factory: ClientFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="regionbus.audit")
    with pytest.raises(AuthenticationError, match="bad signature"):
        _client(client_factory, "writer", secret="not-the-secret")
    assert any(
        "principal=writer operation=CONNECT" in line and "bad signature" in line
        for line in _audit_lines(caplog)
    )


class _RawSender:
    """Signs and produces operations by hand, and reads the replies to its client id.

    Args:
        sender_config: librdkafka keys of the Kafka user it produces as; that user also
            creates the reply topic unless ``reader_config`` is given.
        kafka_principal: The Kafka principal whose shared reply topic its operations name
            (the sender's user, or the victim's).
        reader_config: librdkafka keys of who reads the replies (the Kafka admin, when the
            reply topic is another principal's, which the sender's user may not read).
    """

    def __init__(
        self,
        sender_config: dict[str, str],
        namespace: str,
        client_id: str,
        kafka_principal: str,
        reader_config: dict[str, str] | None = None,
    ) -> None:
        self.topics = Topics(namespace)
        self.client_id = client_id
        self.namespace = namespace
        self.kafka_principal = kafka_principal
        replies = client_topic_specs(self.topics, kafka_principal)[1]
        if reader_config is None:
            reader_config = sender_config
            ensure_topics(kafka_admin(sender_config), [replies])
        self.producer = kafka_producer(sender_config)
        self.consumer = kafka_consumer(
            {
                **reader_config,
                "group.id": self.topics.client_group(client_id),
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        count = topic_partitions(self.consumer, replies.name, 10)
        partition = client_partition(client_id, count)
        self.consumer.assign([TopicPartition(replies.name, partition, 0)])
        self._sequence = 0

    def put(self, key: str, value: bytes, request_id: int) -> tuple[bytes, int]:
        bucket = bucket_of("r", key, 16)
        self._sequence += 1
        op = Operation(
            request_id=request_id,
            client_id=self.client_id,
            kind=OperationKind.PUT,
            region="r",
            timestamp_ms=int(time.time() * 1000),
            event_id=EventID(self.client_id, 1, self._sequence, bucket),
            key=key,
            value=value,
            serializer="bytes",
            kafka_principal=self.kafka_principal,
        )
        return encode(op), bucket

    def send(self, value: bytes, bucket: int, headers: list[Any]) -> None:
        self.producer.produce(self.topics.ops, value, partition=bucket, headers=headers)
        assert self.producer.flush(10) == 0

    def reply(self, request_id: int, timeout_s: float = 15.0) -> Reply:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self.consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            if message.key() != self.client_id.encode():
                continue
            for raw in split_batch(message.value()):
                reply = decode(raw)
                if isinstance(reply, Reply) and reply.request_id == request_id:
                    return reply
        raise AssertionError(f"no reply to request {request_id}")

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def raw_sender(
    secured_server: CacheServer, kafka_users: KafkaUsers, namespace: str
) -> Iterator[_RawSender]:
    """A hand-made client ``raw-client``: to Kafka a client like any other (its user holds
    that client id's ACLs), so only the servers' checks stand between it and the data."""
    kafka_users.grant(RAW_USER, client_acls(namespace, "raw-client", RAW_USER))
    sender = _RawSender(kafka_users.librdkafka(RAW_USER), namespace, "raw-client", RAW_USER)
    try:
        yield sender
    finally:
        sender.close()


def _signed(
    principal: str, secret: str, namespace: str, topic: str, bucket: int, value: bytes
) -> list[Any]:
    return Signer.from_secret(namespace, principal, secret).headers(topic, bucket, value)


@pytest.mark.parametrize("attack", ["forged", "tampered", "unknown_principal", "unsigned"])
def test_forged_tampered_unknown_and_unsigned_messages_are_refused_audited_dead_lettered(
    attack: str,
    raw_sender: _RawSender,
    redis_client: redis.Redis,
    namespace: str,
    kafka_users: KafkaUsers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="regionbus.audit")
    ops = raw_sender.topics.ops
    value, bucket = raw_sender.put("target", b"evil", request_id=7)
    if attack == "forged":
        headers = _signed("writer", "guessed-key", namespace, ops, bucket, value)
        reason = "bad signature"
    elif attack == "tampered":
        headers = _signed("writer", SECRETS["writer"], namespace, ops, bucket, value)
        value = value.replace(b"evil", b"evil"[:-1] + b"L")  # one byte changed
        reason = "bad signature"
    elif attack == "unknown_principal":
        headers = _signed("ghost", "whatever", namespace, ops, bucket, value)
        reason = "unknown principal 'ghost'"
    else:
        headers = []
        reason = "unsigned message"
    raw_sender.send(value, bucket, headers)

    reply = raw_sender.reply(7)
    assert not reply.ok
    error = error_from_wire(reply.error_type, reply.error_message)
    assert isinstance(error, AuthenticationError)
    assert reason in str(error)
    assert _stored(redis_client, namespace, "r", "target") is None
    assert any(
        "operation=PUT region=r client=raw-client" in line and reason in line
        for line in _audit_lines(caplog)
    )
    dead = _topic_values(kafka_users, Topics(namespace).dead_letter)
    assert [v for v, h in dead if reason in h.get("rb.reason", b"").decode()] == [value]


def test_a_replayed_signed_message_is_refused_and_changes_nothing(
    raw_sender: _RawSender,
    redis_client: redis.Redis,
    namespace: str,
    kafka_users: KafkaUsers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="regionbus.audit")
    ops = raw_sender.topics.ops
    first, bucket = raw_sender.put("k", b"v1", request_id=1)
    first_headers = _signed("writer", SECRETS["writer"], namespace, ops, bucket, first)
    raw_sender.send(first, bucket, first_headers)
    assert raw_sender.reply(1).ok
    second, _ = raw_sender.put("k", b"v2", request_id=2)
    raw_sender.send(
        second, bucket, _signed("writer", SECRETS["writer"], namespace, ops, bucket, second)
    )
    assert raw_sender.reply(2).ok
    assert _stored(redis_client, namespace, "r", "k") == b"v2"

    raw_sender.send(first, bucket, first_headers)  # the very same message, again

    reply = raw_sender.reply(1)
    assert not reply.ok
    assert isinstance(error_from_wire(reply.error_type, reply.error_message), AuthenticationError)
    assert "replayed" in (reply.error_message or "")
    assert _stored(redis_client, namespace, "r", "k") == b"v2"
    assert any("replayed" in line for line in _audit_lines(caplog))
    dead = _topic_values(kafka_users, Topics(namespace).dead_letter)
    assert [v for v, h in dead if "replayed" in h.get("rb.reason", b"").decode()] == [first]


def test_a_message_signed_outside_the_allowed_skew_is_refused(
    raw_sender: _RawSender, redis_client: redis.Redis, namespace: str
) -> None:
    ops = raw_sender.topics.ops
    value, bucket = raw_sender.put("old", b"v", request_id=9)
    signer = Signer.from_secret(namespace, "writer", SECRETS["writer"])
    stale_ms = int(time.time() * 1000) - 120_000  # allowed skew is 60 s
    raw_sender.send(value, bucket, signer.headers(ops, bucket, value, timestamp_ms=stale_ms))

    reply = raw_sender.reply(9)
    assert reply.error_type == "AuthenticationError"
    assert "allowed skew" in (reply.error_message or "")
    assert _stored(redis_client, namespace, "r", "old") is None


def test_a_principal_cannot_act_as_another_principals_client_id(
    secured_server: CacheServer,
    client_factory: ClientFactory,
    kafka_users: KafkaUsers,
    namespace: str,
) -> None:
    victim = _client(client_factory, "reader")
    victim.create_region("r").register_interest("ALL_KEYS")
    # The attacker may write {ns}.ops like any client; the victim's reply topic it may not
    # read, so the Kafka admin watches the reply there.
    kafka_users.grant(RAW_USER, client_acls(namespace, "raw-client", RAW_USER))
    sender = _RawSender(
        kafka_users.librdkafka(RAW_USER),
        namespace,
        victim.client_id,
        "reader",
        reader_config=kafka_users.node.client_config(),
    )
    try:
        op = Operation(
            request_id=5,
            client_id=victim.client_id,
            kind=OperationKind.UNREGISTER_INTEREST,
            region="r",
            timestamp_ms=int(time.time() * 1000),
            interest=None,
            kafka_principal="reader",
        )
        value = encode(op)
        ops = Topics(namespace).ops
        sender.send(value, 0, _signed("writer", SECRETS["writer"], namespace, ops, 0, value))
        reply = sender.reply(5)
    finally:
        sender.close()
    assert reply.error_type == "NotAuthorizedError"
    assert "belongs to another principal" in (reply.error_message or "")


# --- what servers produce is signed; clients take nothing else -------------------------


def _forge_event(namespace: str, key: str, value: str, sequence: int) -> bytes:
    """An event that looks like a server's: new thread, new sequence, valid JSON value."""
    return encode(
        Event(
            event_id=EventID("forger-member", 7, sequence, bucket_of("r", key, 16)),
            kind=EventKind.CREATE,
            region="r",
            version=1,
            timestamp_ms=int(time.time() * 1000),
            originator="forger",
            key=key,
            value=json.dumps(value).encode(),
            serializer="json",
        )
    )


def test_a_forged_event_in_a_clients_queue_is_dropped_counted_and_never_applied(
    secured_server: CacheServer,
    client_factory: ClientFactory,
    kafka_users: KafkaUsers,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="regionbus.client")
    reader_cache = _client(client_factory, "reader")
    recorder = Recorder()
    reader = reader_cache.create_region("r", listeners=[recorder])
    reader.register_interest("ALL_KEYS")
    writer = _client(client_factory, "writer").create_region("r")
    address = reader_cache.pool.address
    queue, partition = address.queue_topic, address.queue_partition

    # Whoever may produce to the queue topic (here Kafka's superuser) forges events:
    # unsigned, signed as the servers with a guessed key, and signed by another principal.
    forger = kafka_producer(kafka_users.node.client_config())
    forged = {
        "unsigned": None,
        "guessed-key": lambda value: Signer(SERVER_PRINCIPAL, b"\x00" * 32).headers(
            queue, partition, value
        ),
        "other-principal": lambda value: _signed(
            "nosy", SECRETS["nosy"], namespace, queue, partition, value
        ),
    }
    for sequence, (key, sign) in enumerate(forged.items()):
        value = _forge_event(namespace, key, "forged", sequence)
        headers = None if sign is None else sign(value)
        forger.produce(queue, value, address.key, partition=partition, headers=headers)
    assert forger.flush(10) == 0
    # Then a genuine change: once it is applied, the forged events before it were read.
    writer.put("genuine", "from the server")
    wait_until(lambda: reader.local_entries().get("genuine") == "from the server", 30)

    assert not set(forged) & set(reader.local_entries())
    assert not set(forged) & {name for _, name, _ in recorder.calls}
    assert reader_cache.subscription_stats.forged == len(forged)
    dropped = [
        r.getMessage() for r in caplog.records if "not signed by a cache server" in r.getMessage()
    ]
    assert len(dropped) == len(forged)


def test_replies_events_and_markers_to_a_client_are_signed_by_the_servers_for_its_principal(
    secured_server: CacheServer,
    client_factory: ClientFactory,
    kafka_users: KafkaUsers,
    namespace: str,
) -> None:
    durable_cache = client_factory(
        "reader",
        client_id="signed-desk",
        durable_client_id="signed-desk",
        security_principal="reader",
        security_secret=SECRETS["reader"],
    )
    region = durable_cache.create_region("r")
    region.register_interest("ALL_KEYS", durable=True)
    durable_cache.ready_for_events()
    _client(client_factory, "writer").create_region("r").put("k", "v")
    wait_until(lambda: region.local_entries().get("k") == "v", 30)
    reader_key = Signer.from_secret(namespace, "reader", SECRETS["reader"])
    address = durable_cache.pool.address
    kinds: set[str] = set()
    for topic, partition in (
        (address.queue_topic, address.queue_partition),
        (address.reply_topic, address.reply_partition),
    ):
        messages = [
            m
            for m in kafka_users.read(topic, partition=partition)
            if m.error() is None and m.key() == address.key
        ]
        assert messages, topic
        for message in messages:
            reader_key.check_from_server(message.headers(), topic, partition, message.value())
            kinds |= {type(decode(raw)).__name__ for raw in split_batch(message.value())}
    assert {"Event", "Marker", "Reply"} <= kinds
