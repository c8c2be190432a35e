"""On a Kafka cluster a topic is ready only when every broker knows it.

A broker's metadata cache learns a new topic a moment after the controller created it;
until then that broker answers ``UNKNOWN_TOPIC_OR_PART`` to any request about it. Once
`ensure_topics` returns, clients bootstrapped from any single broker of a three-broker
cluster describe, produce to and consume from the topic at once, round after round, with
busy loops taking the machine's cores beside them. In each round one broker is paused
for a moment while the topics are created (SIGSTOP, then SIGCONT: as a long GC pause or a
starved process is), so its metadata lags as a loaded machine's brokers' do, only more
often.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource

from regionbus.devstack import KafkaCluster
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.topics import TopicSpec, ensure_topics

_ROUNDS = 50
_TOPICS_PER_ROUND = 3
_PARTITIONS = 3
_REQUEST_TIMEOUT_S = 10.0
_PAUSE_S = 0.3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes, each broker and controller, on loopback."""
    cluster = KafkaCluster(
        nodes=3, work_dir=tmp_path_factory.mktemp("kafka") / "cluster", heap_max_mb=512
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """One busy loop per core, for the length of the test."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _addresses(cluster: KafkaCluster) -> dict[int, str]:
    brokers = (
        kafka_admin({"bootstrap.servers": cluster.bootstrap_servers})
        .list_topics(timeout=30)
        .brokers
    )
    assert len(brokers) == 3
    return {b.id: f"{b.host}:{b.port}" for b in brokers.values()}


def _pause(cluster: KafkaCluster, broker_id: int) -> threading.Thread:
    """Stop one broker's process for :data:`_PAUSE_S`, from a thread started now."""
    pid = cluster.node_of_broker(broker_id).pid
    assert pid is not None

    def pause() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(_PAUSE_S)
        finally:
            os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=pause, name=f"pause-{broker_id}")
    thread.start()
    return thread


def test_a_topic_ensure_topics_returned_is_known_to_every_broker_at_once(
    cluster: KafkaCluster, busy_cores: None, tmp_path: Path
) -> None:
    creator = kafka_admin({"bootstrap.servers": cluster.bootstrap_servers})
    addresses = _addresses(cluster)
    # Clients of one broker each, made once so that each is connected to its broker alone.
    admins = {b: kafka_admin({"bootstrap.servers": a}) for b, a in addresses.items()}
    producers = {
        b: kafka_producer({"bootstrap.servers": a, "acks": "all", "linger.ms": 0})
        for b, a in addresses.items()
    }
    consumers = {
        b: kafka_consumer(
            {
                "bootstrap.servers": a,
                "group.id": f"ready-{b}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        for b, a in addresses.items()
    }
    answered_by: Counter[int] = Counter()
    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    try:
        for round_number in range(_ROUNDS):
            names = [f"ready-{round_number}-{i}" for i in range(_TOPICS_PER_ROUND)]
            paused = _pause(cluster, sorted(addresses)[round_number % len(addresses)])
            try:
                created = ensure_topics(
                    creator, [TopicSpec(name, _PARTITIONS, {}) for name in names], timeout_s=60
                )
            finally:
                paused.join()
            assert sorted(created) == names

            # Every broker at once: its metadata, then its view of the configs.
            for broker_id, admin in admins.items():
                for name in names:
                    answer = admin.list_topics(topic=name, timeout=_REQUEST_TIMEOUT_S)
                    answered_by[answer.orig_broker_id] += 1
                    topic = answer.topics[name]
                    assert topic.error is None, (round_number, broker_id, name, topic.error)
                    assert len(topic.partitions) == _PARTITIONS
                    assert all(p.leader >= 0 for p in topic.partitions.values())
            described = {
                (broker_id, name): future
                for broker_id, admin in admins.items()
                for name in names
                for future in admin.describe_configs(
                    [ConfigResource(ConfigResource.Type.TOPIC, name)],
                    request_timeout=_REQUEST_TIMEOUT_S,
                ).values()
            }
            for (broker_id, name), future in described.items():
                try:
                    future.result(timeout=_REQUEST_TIMEOUT_S)
                except KafkaException as exc:
                    pytest.fail(f"round {round_number}: broker {broker_id} on {name}: {exc}")

            # Then a record through each broker's producer, read back by its consumer.
            for broker_id, producer in producers.items():
                for name in names:
                    producer.produce(
                        name,
                        f"{broker_id}".encode(),
                        partition=broker_id % _PARTITIONS,
                        on_delivery=delivered,
                    )
                assert producer.flush(_REQUEST_TIMEOUT_S) == 0
            assert failures == [], (round_number, failures)
            # Read back by one broker's consumer, each broker's in turn: every record of
            # the round, from the partition each producer wrote.
            reader = sorted(consumers)[round_number % len(consumers)]
            consumer = consumers[reader]
            consumer.assign(
                [
                    TopicPartition(name, broker_id % _PARTITIONS, OFFSET_BEGINNING)
                    for name in names
                    for broker_id in producers
                ]
            )
            wanted = {(name, str(broker_id)) for name in names for broker_id in producers}
            seen: set[tuple[str, str]] = set()
            deadline = time.monotonic() + _REQUEST_TIMEOUT_S
            while seen != wanted and time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    seen.add((str(message.topic()), bytes(message.value() or b"").decode()))
            assert seen == wanted, (round_number, reader, wanted - seen)
            consumer.unassign()
    finally:
        for consumer in consumers.values():
            consumer.close()
    # Each broker answered for itself (the check was not one broker's, three times).
    assert set(answered_by) == set(addresses), answered_by
