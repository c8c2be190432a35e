"""The local stack: embedded Apache Kafka (KRaft) and redis-server start, serve, stop, keep
their data across a restart, and yield to env vars."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import ConfigResource
from redis.cluster import RedisCluster

from regionbus.devstack import (
    KAFKA_ENV_VAR,
    REDIS_ENV_VAR,
    EmbeddedKafka,
    EmbeddedRedis,
    EmbeddedRedisCluster,
    LocalStack,
    free_port,
)
from regionbus.devstack import process as devstack_process
from regionbus.devstack.local import DEPRECATED_ENV_VARS
from regionbus.runtime.redis_connect import connect_redis_url
from regionbus.schemas.errors import RegionBusError, StackError
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.topics import TopicSpec, ensure_topics
from regionbus.schemas.transport import committed_offsets, watermarks

# Upper bounds on waits for a condition, generous for a loaded shared machine: a step
# that ends sooner returns at once.
_CONSUME_DEADLINE_S = 60.0
_FLUSH_TIMEOUT_S = 60.0
_METADATA_TIMEOUT_S = 30.0


def _child_pids() -> set[int]:
    pids: set[int] = set()
    for children in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        pids.update(int(pid) for pid in children.read_text().split())
    return pids


def _assert_process_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _assert_port_free(port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        # SO_REUSEADDR lets the bind ignore TIME_WAIT leftovers but not a live listener.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()


def _create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    ensure_topics(
        kafka_admin({"bootstrap.servers": bootstrap_servers}), [TopicSpec(topic, partitions)]
    )


def _consume_all(bootstrap_servers: str, group: str, topic: str) -> list[bytes | None]:
    """Values of ``topic`` partition 0 from the group's committed offset (else the start)
    until the end, committing what was read."""
    consumer = kafka_consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partition = TopicPartition(topic, 0)
        # Just after a restart the group's coordinator may still be loading its offsets
        # ("not coordinator"): these helpers ask again, as the server's own readers do.
        _, high = watermarks(consumer, partition, _METADATA_TIMEOUT_S)
        committed = committed_offsets(consumer, [partition], _METADATA_TIMEOUT_S)[0].offset
        consumer.assign([TopicPartition(topic, 0, max(committed, 0))])
        values: list[bytes | None] = []
        deadline = time.monotonic() + _CONSUME_DEADLINE_S
        position = max(committed, 0)
        while position < high and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            values.append(message.value())
            position = message.offset() + 1
        if values:
            consumer.commit(offsets=[TopicPartition(topic, 0, position)], asynchronous=False)
        return values
    finally:
        consumer.close()


def test_free_port_returns_a_bindable_loopback_port() -> None:
    port = free_port()
    assert 0 < port < 65536
    _assert_port_free(port)


def test_embedded_kafka_start_returns_bootstrap_that_answers_metadata() -> None:
    with EmbeddedKafka() as kafka:
        bootstrap = kafka.start()
        assert bootstrap == f"127.0.0.1:{kafka.port}"
        assert kafka.bootstrap_servers == bootstrap
        metadata = kafka_admin({"bootstrap.servers": bootstrap}).list_topics(timeout=5)
        assert metadata.brokers
        assert kafka.log_path.is_file()


def test_topic_with_16_partitions_can_be_created(
    kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = f"{namespace}.ops"
    _create_topic(kafka_bootstrap_servers, topic, partitions=16)

    metadata = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers}).list_topics(
        topic, timeout=5
    )
    assert len(metadata.topics[topic].partitions) == 16


def test_produce_then_assign_consume_round_trips_key_value_and_headers(
    kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = f"{namespace}.ops"
    _create_topic(kafka_bootstrap_servers, topic, partitions=16)
    headers: list[tuple[str, str | bytes | None]] = [("event-id", b"m1:t1:7:3"), ("kind", b"put")]
    producer = kafka_producer(
        {"bootstrap.servers": kafka_bootstrap_servers, "acks": "all", "linger.ms": 5}
    )
    producer.produce(topic, key=b"k1", value=b"v1", partition=7, headers=headers)
    assert producer.flush(10) == 0

    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka_bootstrap_servers,
            "group.id": namespace,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 7, OFFSET_BEGINNING)])
        deadline = time.monotonic() + _CONSUME_DEADLINE_S
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                pytest.fail(f"consume error: {message.error()}")
    finally:
        consumer.close()

    assert message is not None, "nothing consumed"
    assert (message.topic(), message.partition()) == (topic, 7)
    assert (message.key(), message.value()) == (b"k1", b"v1")
    assert message.headers() == headers


def test_redis_answers_ping_set_get(redis_client: redis.Redis, namespace: str) -> None:
    assert redis_client.ping() is True
    key = f"{namespace}:key"
    assert redis_client.set(key, b"\x00value") is True
    assert redis_client.get(key) == b"\x00value"


def test_embedded_kafka_stop_ends_the_process_and_frees_both_ports() -> None:
    kafka = EmbeddedKafka()
    try:
        kafka.start()
        pid, port, controller_port = kafka.pid, kafka.port, kafka.controller_port
        assert pid is not None and port is not None and controller_port is not None
    finally:
        kafka.close()

    assert kafka.pid is None
    _assert_process_gone(pid)
    _assert_port_free(port)
    _assert_port_free(controller_port)
    assert not kafka.work_dir.exists()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_embedded_kafka_restarted_on_its_work_dir_keeps_topics_messages_and_offsets(
    tmp_path: Path, how: str
) -> None:
    """The broker's log is on disk: after a clean stop or a SIGKILL, a node started again
    on the same work dir (even as a new object) is on the same port and still has the
    topic, every acknowledged message and the group's committed offset."""
    work_dir = tmp_path / "kafka"
    first = EmbeddedKafka(work_dir=work_dir)
    try:
        bootstrap = first.start()
        _create_topic(bootstrap, "kept", partitions=1)
        producer = kafka_producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(10):
            producer.produce("kept", f"m{i}".encode(), partition=0)
        assert producer.flush(_FLUSH_TIMEOUT_S) == 0
        assert _consume_all(bootstrap, "g", "kept")[:3] == [b"m0", b"m1", b"m2"]
        producer.produce("kept", b"after-commit", partition=0)
        assert producer.flush(_FLUSH_TIMEOUT_S) == 0
        if how == "kill":
            first.kill()
        else:
            first.stop()
    except BaseException:
        # A failed step must not leave the broker running past the test.
        first.kill()
        raise

    again = EmbeddedKafka(work_dir=work_dir)
    try:
        assert again.start() == bootstrap
        assert _consume_all(bootstrap, "g", "kept") == [b"after-commit"]
    finally:
        again.close()


def test_embedded_redis_stop_ends_the_process_and_frees_the_port() -> None:
    with EmbeddedRedis() as server:
        url = server.start()
        pid, port = server.pid, server.port
        assert pid is not None and port is not None
        assert url == f"redis://127.0.0.1:{port}/0"
        server.stop()

    assert server.pid is None
    _assert_process_gone(pid)
    _assert_port_free(port)


def test_embedded_redis_with_appendonly_keeps_data_across_restart() -> None:
    with EmbeddedRedis(appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        try:
            client.set("k", b"v")
        finally:
            client.close()
        port = server.port
        server.stop()

        assert server.start() == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(server.url)
        try:
            assert client.get("k") == b"v"
        finally:
            client.close()


def test_embedded_kafka_on_a_taken_port_raises_stack_error_with_log() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        # Kafka exits at once on the bind error; the time bound only guards a slow start.
        kafka = EmbeddedKafka(port=port, start_timeout_s=120.0)
        try:
            with pytest.raises(StackError, match="taken") as raised:
                kafka.start()
        finally:
            kafka.close()

    assert isinstance(raised.value, RegionBusError)
    assert kafka.pid is None


def test_embedded_kafka_without_a_port_retries_when_the_free_port_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr(devstack_process, "free_port", lambda: next(ports, None) or free_port())

        with EmbeddedKafka() as kafka:
            assert kafka.port not in (None, taken)
            assert kafka.pid is not None


def test_a_redis_cluster_node_whose_bus_port_was_taken_starts_on_new_ports() -> None:
    # Ports are probed, not reserved: on a busy machine another process took a fresh
    # node's cluster bus port between the probe and the bind, and the cluster did not start.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        cluster = EmbeddedRedisCluster(masters=3, replicas=0)
        cluster.nodes[0].cluster_port = taken
        with cluster:
            assert cluster.nodes[0].cluster_port not in (None, taken)
            client = RedisCluster.from_url(cluster.url)
            try:
                client.set("k", "v")
                assert client.get("k") == b"v"
            finally:
                client.close()


def test_embedded_redis_without_binary_raises_stack_error_naming_apt_get(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(StackError, match="apt-get install redis-server"):
        EmbeddedRedis()


def test_env_vars_override_the_stack_and_start_no_process(
    local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KAFKA_ENV_VAR, local_stack.kafka_bootstrap_servers)
    monkeypatch.setenv(REDIS_ENV_VAR, local_stack.redis_url)
    children_before = _child_pids()

    with LocalStack() as stack:
        assert stack.source == "env"
        assert (stack.kafka_source, stack.redis_source) == ("env", "env")
        assert stack.kafka_bootstrap_servers == local_stack.kafka_bootstrap_servers
        assert stack.redis_url == local_stack.redis_url
        assert stack.kafka is None and stack.redis is None
        assert _child_pids() <= children_before


def test_the_older_variable_names_still_work_with_a_warning(
    local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(KAFKA_ENV_VAR, raising=False)
    monkeypatch.delenv(REDIS_ENV_VAR, raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", local_stack.kafka_bootstrap_servers)
    monkeypatch.setenv("REDIS_URL", local_stack.redis_url)

    with caplog.at_level(logging.WARNING, logger="regionbus.devstack.local"), LocalStack() as stack:
        assert (stack.kafka_source, stack.redis_source) == ("env", "env")
        assert stack.kafka_bootstrap_servers == local_stack.kafka_bootstrap_servers
        assert stack.redis_url == local_stack.redis_url

    assert sorted(r.getMessage() for r in caplog.records) == [
        "environment variable KAFKA_BOOTSTRAP_SERVERS is deprecated: set "
        "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS instead",
        "environment variable REDIS_URL is deprecated: set REGIONBUS_REDIS_URL instead",
    ]


def test_a_service_takes_its_preferred_port_when_free_and_another_when_taken() -> None:
    wanted = free_port()
    first, second = EmbeddedRedis(), EmbeddedRedis()
    try:
        assert first.prefer_port(wanted)
        assert first.start() == f"redis://127.0.0.1:{wanted}/0"
        assert not second.prefer_port(wanted), "took a port a running Redis holds"
        assert second.start() != first.start()
    finally:
        second.close()
        first.close()


def test_local_stack_without_env_or_docker_starts_embedded_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (KAFKA_ENV_VAR, REDIS_ENV_VAR, *DEPRECATED_ENV_VARS.values()):
        monkeypatch.delenv(name, raising=False)
    with LocalStack(use_docker=False) as stack:
        assert stack.source == "embedded"
        assert stack.kafka is not None and stack.redis is not None
        pids = {stack.kafka.pid, stack.redis.pid}
        assert None not in pids and pids <= _child_pids()
        client = redis.Redis.from_url(stack.redis_url)
        try:
            assert client.ping() is True
        finally:
            client.close()

    for pid in pids:
        assert pid is not None
        _assert_process_gone(pid)


def test_the_cluster_stack_comes_back_on_its_data_dir_with_its_topics_and_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``regionbus stack --brokers 3 --redis-cluster``: three Kafka brokers (topics with
    replication 3 and min.insync.replicas 2) and a Redis Cluster of three masters with a
    replica each, stopped and started again on the same folder: same addresses, the topic,
    its messages and the Redis entries are still there."""
    for name in (KAFKA_ENV_VAR, REDIS_ENV_VAR, *DEPRECATED_ENV_VARS.values()):
        monkeypatch.delenv(name, raising=False)
    options = {"use_docker": False, "data_dir": tmp_path, "kafka_brokers": 3}
    with LocalStack(**options, redis_cluster=True) as stack:
        assert stack.redis_cluster is not None and stack.kafka_cluster is not None
        bootstrap, url = stack.kafka_bootstrap_servers, stack.redis_url
        admin = kafka_admin({"bootstrap.servers": bootstrap})
        ensure_topics(admin, [TopicSpec("kept", 2, {})])
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "kept")])
        (config,) = [f.result(30) for f in described.values()]
        assert config["min.insync.replicas"].value == "2"
        partitions = admin.list_topics("kept", timeout=30).topics["kept"].partitions
        assert {len(p.replicas) for p in partitions.values()} == {3}
        producer = kafka_producer({"bootstrap.servers": bootstrap, "acks": "all"})
        producer.produce("kept", b"m0", partition=0)
        assert producer.flush(30) == 0
        masters = {stack.redis_cluster.master_of(f"{{k{i}}}:v").port for i in range(40)}
        client = connect_redis_url(url)
        assert isinstance(client, RedisCluster) and len(masters) == 3
        for i in range(40):
            client.set(f"{{k{i}}}:v", i)
        client.close()

    with LocalStack(**options, redis_cluster=True) as again:
        assert (again.kafka_bootstrap_servers, again.redis_url) == (bootstrap, url)
        consumer = kafka_consumer({"bootstrap.servers": bootstrap, "group.id": "g"})
        consumer.assign([TopicPartition("kept", 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + _CONSUME_DEADLINE_S * 4
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        consumer.close()
        assert message is not None and message.value() == b"m0"
        client = connect_redis_url(url)
        try:
            assert [int(client.get(f"{{k{i}}}:v")) for i in range(40)] == list(range(40))
        finally:
            client.close()
