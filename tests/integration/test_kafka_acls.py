"""Kafka's own access control, on a Kafka of this module with SASL/SCRAM and ACLs enforced:
servers and clients work with exactly the ACLs `regionbus.broker.kafka_acls` gives them, a client
can neither read nor write another Kafka user's shared queue and reply topics (it can read
those of its own user, whose clients share them: the isolation boundary is the Kafka user),
and a missing ACL is a typed `KafkaAuthorizationError` naming what Kafka refused, not a raw
KafkaException or a hang.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from kafka_users import KafkaUsers
from support import Recorder, wait_until

from regionbus.broker.cli import main
from regionbus.broker.config import ServerSettings
from regionbus.broker.kafka_acls import KafkaAcl, client_acls, server_acls
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache, ClientSettings, RegionShortcut
from regionbus.clients.cq_query import CqAttributes, CqEvent, CqListener
from regionbus.clients.subscription import SubscriptionQueue
from regionbus.devstack import KafkaNode
from regionbus.devstack.jvm import java_program, jvm_lib_dir
from regionbus.schemas.errors import KafkaAuthorizationError
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.naming import Topics
from regionbus.schemas.transport import committed_offsets, kafka_error

SERVER_USER = "regionbus-server"
FAST_FETCH_MS = 20

ClientMaker = Callable[..., ClientCache]


@pytest.fixture(scope="module")
def kafka_users(scram_kafka: KafkaNode) -> KafkaUsers:
    return KafkaUsers(scram_kafka)


@pytest.fixture
def server(namespace: str, kafka_users: KafkaUsers, redis_url: str) -> Iterator[CacheServer]:
    """A cache server of region ``r``, logged in as the servers' user with their ACLs."""
    kafka_users.grant(SERVER_USER, server_acls(namespace))
    settings = ServerSettings(
        namespace=namespace,
        **kafka_users.settings(SERVER_USER),
        redis_url=redis_url,
        regions=["r"],
        fetch_wait_max_ms=FAST_FETCH_MS,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
        maximum_time_between_pings_ms=2_000,
        durable_client_reaper_interval_s=0.5,
    )
    with CacheServer(settings) as started:
        yield started


def _client_settings(
    kafka_users: KafkaUsers, namespace: str, user: str, client_id: str, **overrides: Any
) -> ClientSettings:
    fields: dict[str, Any] = {
        "namespace": namespace,
        **kafka_users.settings(user),
        "client_id": client_id,
        "fetch_wait_max_ms": FAST_FETCH_MS,
        "read_timeout_ms": 30_000,
        "ping_interval_ms": 300,
        "metadata_timeout_s": 10,
    }
    fields.update(overrides)
    return ClientSettings(**fields)


@pytest.fixture
def connect(server: CacheServer, kafka_users: KafkaUsers, namespace: str) -> Iterator[ClientMaker]:
    """Connects a client as Kafka user ``user`` with client id ``client_id`` (keyword
    settings override); the user holds that client id's ACLs unless ``acls`` says others."""
    made: list[ClientCache] = []

    def make(
        user: str, client_id: str, acls: list[KafkaAcl] | None = None, **overrides: Any
    ) -> ClientCache:
        durable = overrides.get("durable_client_id")
        kafka_users.grant(
            user, client_acls(namespace, durable or client_id, user) if acls is None else acls
        )
        cache = ClientCache(_client_settings(kafka_users, namespace, user, client_id, **overrides))
        made.append(cache)
        return cache

    try:
        yield make
    finally:
        for cache in made:
            if not cache.closed:
                cache.close()


# --- servers and clients with exactly their ACLs ----------------------------------------


def test_puts_interest_and_a_durable_client_work_with_exactly_the_servers_and_clients_acls(
    connect: ClientMaker, kafka_users: KafkaUsers, namespace: str
) -> None:
    topics = Topics(namespace)
    writer_cache = connect("app-writer", "writer")
    writer = writer_cache.create_region("r")
    writer.put("before", 0)
    recorder = Recorder()
    durable = connect("app-desk", "desk", durable_client_id="desk", durable_client_timeout_s=60)
    durable.create_region("r", listeners=[recorder]).register_interest("ALL_KEYS", durable=True)
    durable.ready_for_events()
    wait_until(lambda: ("region_live", "r", None) in recorder.snapshot(), what="the marker")
    writer.put("live", 1)
    wait_until(lambda: ("create", "live", 1) in recorder.snapshot(), what="a live event")
    durable.close(keep_alive=True)
    for i in range(3):
        writer.put(f"away{i}", i)

    again_recorder = Recorder()
    again = connect("app-desk", "desk", durable_client_id="desk", durable_client_timeout_s=1)
    assert again.client_state == "RECONNECTED"
    assert again.pending_event_count == 3
    again_region = again.create_region("r", listeners=[again_recorder])
    again_region.register_interest("ALL_KEYS", durable=True)
    again.ready_for_events()
    wait_until(lambda: ("region_live", "r", None) in again_recorder.snapshot(), what="marker")
    replayed = again_recorder.snapshot()
    assert [(key, value) for _, key, value in replayed[:-1]] == [(f"away{i}", i) for i in range(3)]
    assert replayed[-1] == ("region_live", "r", None)
    assert again_region.get("before") == 0

    assert kafka_users.granted(SERVER_USER) == set(server_acls(namespace))
    assert kafka_users.granted("app-writer") == set(client_acls(namespace, "writer", "app-writer"))
    assert kafka_users.granted("app-desk") == set(client_acls(namespace, "desk", "app-desk"))

    # A client deletes its own acks at a non-durable close (its Delete ACL)...
    writer_cache.close()
    assert topics.client_group("writer") not in kafka_users.group_names()
    # ...and the servers those of a durable client whose timeout ran out (theirs).
    again.close(keep_alive=True)
    wait_until(
        lambda: topics.client_group("desk") not in kafka_users.group_names(),
        timeout_s=30,
        what="the servers to delete the expired durable client's acks",
    )


def test_every_cq_operation_works_with_exactly_the_clients_acls(
    connect: ClientMaker, kafka_users: KafkaUsers, namespace: str
) -> None:
    """A durable client of its own Kafka user runs, stops, runs with initial results,
    lists and closes a durable CQ: each is answered in its user's reply topic and its CQ
    events reach it in its user's queue topic, with no ACL beyond the client's."""
    holder = connect("app-cq", "cq-desk", durable_client_id="cq-desk", durable_client_timeout_s=60)
    holder.create_region("r", RegionShortcut.PROXY)
    service = holder.query_service()
    events: list[tuple[str, Any]] = []

    class Listener(CqListener):
        def on_event(self, event: CqEvent) -> None:
            events.append((event.key, event.new_value))

    cq = service.new_cq(
        "delayed", "SELECT * FROM /r f WHERE f.delay > 60", CqAttributes([Listener()]), True
    )
    cq.execute()
    holder.ready_for_events()
    writer = connect("app-writer", "cq-writer").create_region("r", RegionShortcut.PROXY)
    writer.put("late", {"delay": 70})
    writer.put("on-time", {"delay": 5})
    wait_until(lambda: ("late", {"delay": 70}) in events, what="the CQ's event")
    assert service.get_all_durable_cqs_from_server() == ["delayed"]
    cq.stop()
    assert cq.is_stopped()
    results = cq.execute_with_initial_results()
    assert [(e.key, e.value) for e in results] == [("late", {"delay": 70})]
    cq.close()
    assert cq.is_closed() and service.get_all_durable_cqs_from_server() == []
    assert ("on-time", {"delay": 5}) not in events
    assert kafka_users.granted("app-cq") == set(client_acls(namespace, "cq-desk", "app-cq"))


# --- one Kafka user against another's topics ---------------------------------------

DIRECTIONS = [("app-a", "a", "app-b", "b"), ("app-b", "b", "app-a", "a")]
"""(attacker's Kafka user, its client id, the victim's user, its client id): both ways."""


@pytest.fixture
def two_clients(connect: ClientMaker) -> dict[str, ClientCache]:
    """Clients ``a`` (Kafka user ``app-a``) and ``b`` (``app-b``), each with its topics."""
    return {"a": connect("app-a", "a"), "b": connect("app-b", "b")}


@pytest.mark.parametrize(("user", "own", "victim_user", "victim"), DIRECTIONS)
def test_a_client_cannot_read_another_users_queue_and_is_told_so_with_a_typed_error(
    two_clients: dict[str, ClientCache],
    kafka_users: KafkaUsers,
    namespace: str,
    user: str,
    own: str,
    victim_user: str,
    victim: str,
) -> None:
    topics = Topics(namespace)
    two_clients[victim].create_region("r").register_interest("ALL_KEYS")
    two_clients[own].create_region("r").put("k", "for the victim's queue")
    # Naming the victim's Kafka user for its topics.
    as_attacker = _client_settings(
        kafka_users, namespace, user, own + "-2", kafka_principal=victim_user
    )
    with pytest.raises(KafkaAuthorizationError) as connecting:
        ClientCache(as_attacker)
    assert connecting.value.kafka_error == "TOPIC_AUTHORIZATION_FAILED"
    assert connecting.value.resource in {
        f"topic {topics.client_queues(victim_user)}",
        f"topic {topics.client_replies(victim_user)}",
    }
    victims_queue = two_clients[victim].pool.address
    with pytest.raises(KafkaAuthorizationError, match="TOPIC_AUTHORIZATION_FAILED") as reading:
        SubscriptionQueue(as_attacker, victim, victims_queue, 0, lambda *_: None, lambda: None)
    assert reading.value.resource == f"topic {topics.client_queues(victim_user)}"

    # Below the library: Kafka itself refuses the attacker's consumer of those topics, in
    # a consumer group the attacker may use, while the admin reads the queued event there.
    attacker = kafka_users.librdkafka(user)
    group = topics.client_group(own)
    for topic in (topics.client_queues(victim_user), topics.client_replies(victim_user)):
        assert _subscribe_error(attacker, group, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    queued = kafka_users.read(victims_queue.queue_topic, partition=victims_queue.queue_partition)
    assert any(m.error() is None and m.key() == victims_queue.key for m in queued)


def test_clients_of_one_kafka_user_share_its_topics_and_each_takes_only_its_own_records(
    connect: ClientMaker, kafka_users: KafkaUsers, namespace: str
) -> None:
    """The isolation boundary is the Kafka user: its clients' records share its topics, a
    client reads the whole of its partition and keeps what is keyed by its id."""
    recorders = {name: Recorder() for name in ("shared-1", "shared-2")}
    caches = {name: connect("app-shared", name) for name in recorders}
    for name, cache in caches.items():
        cache.create_region("r", listeners=[recorders[name]]).register_interest([name])
    writer = connect("app-writer", "writer-2").create_region("r")
    for name in recorders:
        writer.put(name, f"for {name}")
    for name, recorder in recorders.items():
        wait_until(lambda r=recorder, n=name: ("create", n, f"for {n}") in r.snapshot())
    addresses = {name: cache.pool.address for name, cache in caches.items()}
    assert {a.queue_topic for a in addresses.values()} == {
        Topics(namespace).client_queues("app-shared")
    }
    for name, recorder in recorders.items():
        assert [key for _, key, _ in recorder.snapshot()] == [name], "another's event reached it"
    # Kafka lets the user read its other client's records: nothing but the key keeps them.
    other = addresses["shared-2"]
    read_as_user = kafka_users.read(
        other.queue_topic, "app-shared", partition=other.queue_partition
    )
    assert any(m.error() is None and m.key() == other.key for m in read_as_user)


@pytest.mark.parametrize(("user", "own", "victim_user", "victim"), DIRECTIONS)
def test_a_client_cannot_produce_into_any_queue_or_reply_topic(
    two_clients: dict[str, ClientCache],
    kafka_users: KafkaUsers,
    namespace: str,
    user: str,
    own: str,
    victim_user: str,
    victim: str,
) -> None:
    topics = Topics(namespace)
    forged = b"forged by " + own.encode()
    for topic in (topics.client_queues(victim_user), topics.client_replies(victim_user)):
        refusal = _produce_error(kafka_users.librdkafka(user), topic, forged)
        assert refusal is not None and refusal.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        error = kafka_error(refusal, f"producing to {topic}", f"topic {topic}")
        assert isinstance(error, KafkaAuthorizationError)
        assert error.resource == f"topic {topic}"
        assert forged not in [m.value() for m in kafka_users.read(topic) if m.error() is None]
    # Its own user's topics stay the servers' to write, too.
    own_queue = topics.client_queues(user)
    refusal = _produce_error(kafka_users.librdkafka(user), own_queue, forged)
    assert refusal is not None and refusal.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _committed(config: dict[str, str], group: str, queue: tuple[str, int]) -> int:
    """The offset ``group`` committed on a partition ``(topic, partition)`` (negative:
    none)."""
    consumer = kafka_consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        return committed_offsets(consumer, [TopicPartition(*queue)], 20)[0].offset
    finally:
        consumer.close()


def _group_refusal(action: Callable[[], object]) -> int | None:
    """The Kafka error code ``action`` raised (None when it succeeded)."""
    try:
        action()
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def test_a_client_cannot_read_commit_or_delete_the_groups_of_a_client_whose_id_extends_it(
    connect: ClientMaker, kafka_users: KafkaUsers, namespace: str
) -> None:
    """Client ids may hold dots. With its groups granted by the prefix
    ``{ns}.client.desk.``, client ``desk`` deleted the group of durable client ``desk.2``,
    whose committed offset (its place in its queue) was lost; granted literally, Kafka
    refuses every reach, and ``desk`` itself works."""
    topics = Topics(namespace)
    writer = connect("app-writer", "writer").create_region("r")
    away = connect("app-desk2", "desk.2", durable_client_id="desk.2", durable_client_timeout_s=600)
    recorder = Recorder()
    away.create_region("r", listeners=[recorder]).register_interest("ALL_KEYS", durable=True)
    away.ready_for_events()
    for i in range(5):
        writer.put(f"k{i}", i)
    wait_until(lambda: ("create", "k4", 4) in recorder.snapshot(), what="desk.2's events")
    away.close(keep_alive=True)
    admin = kafka_users.node.client_config()
    address2 = away.pool.address
    queue2 = (address2.queue_topic, address2.queue_partition)
    group2 = topics.client_group("desk.2")
    acked = _committed(admin, group2, queue2)
    assert acked > 0

    desk = connect("app-desk", "desk")
    attacker = kafka_users.librdkafka("app-desk")
    attacker_admin = kafka_admin(attacker)
    refused = {
        "delete": _group_refusal(
            lambda: attacker_admin.delete_consumer_groups([group2])[group2].result(timeout=20)
        ),
        "delete replies": _group_refusal(
            lambda: attacker_admin.delete_consumer_groups([topics.client_reply_group("desk.2")])[
                topics.client_reply_group("desk.2")
            ].result(timeout=20)
        ),
        "read offsets": _group_refusal(
            lambda: attacker_admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group2, [TopicPartition(*queue2)])]
            )[group2].result(timeout=20)
        ),
        "commit": _group_refusal(
            lambda: attacker_admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group2, [TopicPartition(*queue2, 0)])]
            )[group2].result(timeout=20)
        ),
    }
    print(f"desk reaching desk.2: {refused}")
    assert refused == dict.fromkeys(refused, KafkaError.GROUP_AUTHORIZATION_FAILED)
    assert _subscribe_error(attacker, topics.client_group("desk"), queue2[0]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    assert _committed(admin, group2, queue2) == acked  # desk.2's place in its queue is kept

    region = desk.create_region("r")
    region.register_interest("ALL_KEYS")
    region.put("from-desk", 1)
    assert region.get("k3") == 3
    # Its own groups it reads, commits and deletes.
    own_group = topics.client_group("desk")
    own_queue = (desk.pool.address.queue_topic, desk.pool.address.queue_partition)
    _commit_as(attacker, own_group, TopicPartition(*own_queue, 0))
    assert _committed(attacker, own_group, own_queue) == 0
    assert (
        _group_refusal(
            lambda: attacker_admin.delete_consumer_groups([own_group])[own_group].result(timeout=20)
        )
        is None
    )


def _commit_as(config: dict[str, str], group: str, partition: TopicPartition) -> None:
    consumer = kafka_consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[partition], asynchronous=False)
    finally:
        consumer.close()


def _subscribe_error(
    config: dict[str, str], group: str, topic: str, timeout_s: float = 30.0
) -> int | None:
    """The error code a consumer of ``group`` subscribed to ``topic`` gets first; None when
    it reads a message instead, or nothing comes within ``timeout_s``."""
    consumer = kafka_consumer(
        {**config, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                error = message.error()
                return None if error is None else int(error.code())
    finally:
        consumer.close()
    return None


def _produce_error(config: dict[str, str], topic: str, value: bytes) -> KafkaError | None:
    reports: list[KafkaError | None] = []
    producer = kafka_producer({**config, "message.timeout.ms": 20_000})
    producer.produce(
        topic, value, partition=0, on_delivery=lambda error, _message: reports.append(error)
    )
    assert producer.flush(30) == 0, "no delivery report"
    return reports[0]


# --- a missing ACL is a clear, typed error ---------------------------------------------


def _without(acls: list[KafkaAcl], resource_name: str, operation: str) -> list[KafkaAcl]:
    kept = [a for a in acls if (a.resource_name, a.operation) != (resource_name, operation)]
    assert len(kept) == len(acls) - 1
    return kept


def test_a_client_without_write_on_ops_fails_its_put_with_the_refusal_not_a_timeout(
    connect: ClientMaker, namespace: str
) -> None:
    ops = Topics(namespace).ops
    cache = connect(
        "app-no-ops",
        "no-ops",
        acls=_without(client_acls(namespace, "no-ops", "app-no-ops"), ops, "Write"),
    )
    region = cache.create_region("r")
    began = time.monotonic()
    with pytest.raises(KafkaAuthorizationError) as refused:
        region.put("k", 1)
    assert refused.value.resource == f"topic {ops}"
    assert "TOPIC_AUTHORIZATION_FAILED" in str(refused.value)
    # Without the delivery report's error the put waited for a reply: read_timeout_ms.
    assert time.monotonic() - began < cache.settings.read_timeout_ms / 1000


def test_a_client_without_write_on_control_is_refused_at_connect(
    connect: ClientMaker, namespace: str
) -> None:
    control = Topics(namespace).control
    with pytest.raises(KafkaAuthorizationError) as refused:
        connect(
            "app-no-control",
            "no-control",
            acls=_without(client_acls(namespace, "no-control", "app-no-control"), control, "Write"),
        )
    assert refused.value.resource == f"topic {control}"


def test_a_client_whose_reply_topic_read_is_revoked_fails_its_requests_with_the_refusal(
    connect: ClientMaker, kafka_users: KafkaUsers, namespace: str
) -> None:
    reply = Topics(namespace).client_replies("app-revoked")
    cache = connect("app-revoked", "revoked")
    region = cache.create_region("r")
    assert region.get("absent") is None
    kafka_users.revoke("app-revoked", [KafkaAcl("topic", reply, "literal", "Read")])
    # Kafka reports the refusal once, at the reply reader's next fetch (a fetch already
    # waiting may still bring a reply); from then on every request fails with it.
    wait_until(lambda: cache.pool.reply_refusal is not None, what="the refused fetch")
    for _ in range(2):
        with pytest.raises(KafkaAuthorizationError) as refused:
            region.get("absent")
        assert refused.value.resource == f"topic {reply}"


def test_a_client_without_an_acl_for_its_client_id_cannot_connect_and_learns_why(
    server: CacheServer, kafka_users: KafkaUsers, namespace: str
) -> None:
    settings = _client_settings(kafka_users, namespace, "app-nobody", "nobody")
    with pytest.raises(KafkaAuthorizationError, match="regionbus kafka-acls"):
        ClientCache(settings)


# --- regionbus kafka-acls ----------------------------------------------------------------


def test_the_kafka_acls_command_grants_a_client_its_acls_and_prints_them_on_a_dry_run(
    server: CacheServer, kafka_users: KafkaUsers, namespace: str, scram_kafka: KafkaNode
) -> None:
    admin = scram_kafka.client_config()
    env = {
        "REGIONBUS_NAMESPACE": namespace,
        "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": admin["bootstrap.servers"],
        "REGIONBUS_KAFKA_SECURITY_PROTOCOL": admin["security.protocol"],
        "REGIONBUS_KAFKA_SASL_MECHANISM": admin["sasl.mechanism"],
        "REGIONBUS_KAFKA_SASL_USERNAME": admin["sasl.username"],
        "REGIONBUS_KAFKA_SASL_PASSWORD": admin["sasl.password"],
    }
    arguments = ["kafka-acls", "client", "--user", "app-cli", "--client-id", "cli-1"]
    runner = CliRunner()
    dry = runner.invoke(main, [*arguments, "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    expected = client_acls(namespace, "cli-1", "app-cli")
    assert dry.output.splitlines() == [f"User:app-cli {acl}" for acl in sorted(expected)]
    assert kafka_users.granted("app-cli") == set()

    kafka_users.settings("app-cli")  # the SCRAM user
    applied = runner.invoke(main, arguments, env=env)
    assert applied.exit_code == 0, applied.output
    assert kafka_users.granted("app-cli") == set(expected)
    cache = ClientCache(_client_settings(kafka_users, namespace, "app-cli", "cli-1"))
    try:
        cache.create_region("r").put("k", "granted by the CLI")
    finally:
        cache.close()


# --- scripts/kafka-acls.sh with Kafka's own tools ----------------------------------------

_TOOL = """#!/usr/bin/env bash
exec {java} -Xmx256m -Dlog4j2.configurationFile={log4j} -cp '{lib}/*' {main} "$@"
"""


def test_scripts_kafka_acls_sh_grants_with_kafkas_own_tools_exactly_the_python_sets(
    server: CacheServer,
    scram_kafka: KafkaNode,
    kafka_users: KafkaUsers,
    namespace: str,
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # What the apache/kafka image's bin/kafka-acls.sh and bin/kafka-configs.sh run.
    for tool, main_class in (
        ("kafka-acls.sh", "org.apache.kafka.tools.AclCommand"),
        ("kafka-configs.sh", "kafka.admin.ConfigCommand"),
    ):
        (bin_dir / tool).write_text(
            _TOOL.format(
                java=java_program(),
                log4j=scram_kafka.work_dir / "log4j2.properties",
                lib=jvm_lib_dir("kafka"),
                main=main_class,
            )
        )
        (bin_dir / tool).chmod(0o755)
    admin = scram_kafka.client_config()
    env = {
        "PATH": os.environ["PATH"],
        "KAFKA_BIN": str(bin_dir),
        "KAFKA_BOOTSTRAP": admin["bootstrap.servers"],
        "KAFKA_ADMIN_PASSWORD": admin["sasl.password"],
        "REGIONBUS_NAMESPACE": namespace,
        "KAFKA_SERVER_USER": "script-server",
        "KAFKA_SERVER_PASSWORD": "script-server-pw",
        "KAFKA_CLIENTS": "script-app:script-app-pw:desk-1",
    }
    script = Path(__file__).resolve().parents[2] / "scripts" / "kafka-acls.sh"
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert kafka_users.granted("script-server") == set(server_acls(namespace))
    assert kafka_users.granted("script-app") == set(client_acls(namespace, "desk-1", "script-app"))

    # The SCRAM user it made logs in with its password and works as client desk-1.
    cache = ClientCache(
        namespace=namespace,
        client_id="desk-1",
        kafka_bootstrap_servers=admin["bootstrap.servers"],
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="script-app",
        kafka_sasl_password="script-app-pw",
        fetch_wait_max_ms=FAST_FETCH_MS,
    )
    try:
        region = cache.create_region("r")
        region.put("k", "through the script's ACLs")
        assert region.get("k") == "through the script's ACLs"
    finally:
        cache.close()
