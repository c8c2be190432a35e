"""The wire format proven from outside Python (docs/wire-format.md): the Java program of
jvm/wire-client, built by Maven with kafka-clients and Apache Avro alone, publishes PUT and
DESTROY operations that real cache servers apply, and reads a client's events from the
shared queue topic (both key forms, batches, rb.to) once each, however often a record is
written."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition
from support import Recorder, wait_until
from test_interest_groups import _ids_sharing_a_partition

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache
from regionbus.devstack.jvm import java_program, jvm_lib_dir
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.topics import DEFAULT_CLIENT_PARTITIONS

ClientFactory = Callable[..., ClientCache]

_JAVA_TIMEOUT_S = 180


def _java(*args: str) -> tuple[int, list[dict[str, Any]]]:
    """Run the Java wire client; its exit status and the JSON lines it printed."""
    classpath = f"{jvm_lib_dir('wire-client')}/*"
    done = subprocess.run(
        [java_program(), "-cp", classpath, "io.regionbus.wire.WireClient", *args],
        capture_output=True,
        text=True,
        timeout=_JAVA_TIMEOUT_S,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no output; stderr: {done.stderr[-2000:]}"
    return done.returncode, lines


def _publish(
    bootstrap: str,
    namespace: str,
    *changes: str,
    member: str | None = None,
    framing: str = "regionbus",
) -> Any:
    options = ["--framing", framing, *(["--member", member] if member else [])]
    status, lines = _java(
        "publish",
        *("--bootstrap", bootstrap, "--namespace", namespace),
        *("--client-id", "java-writer", "--region", "r", *options),
        *changes,
    )
    assert status == 0, lines
    return [
        (line["operation"], line["key"], line["event_kind"], line["duplicate"]) for line in lines
    ]


def test_the_servers_apply_the_java_programs_puts_and_destroys(
    cache_server: CacheServer,
    client_factory: ClientFactory,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    replies = _publish(
        kafka_bootstrap_servers,
        namespace,
        *("put", "a", '{"qty":3}', "put", "b", '"text"', "destroy", "a", "put", "c", "[1,2]"),
    )
    assert replies == [
        ("PUT", "a", "CREATE", False),
        ("PUT", "b", "CREATE", False),
        ("DESTROY", "a", "DESTROY", False),
        ("PUT", "c", "CREATE", False),
    ]
    reader = client_factory(subscription_enabled=False).create_region("r")
    assert reader.get("b") == "text"
    assert reader.get("c") == [1, 2]
    assert reader.get("a") is None
    assert not reader.contains_key_on_server("a")

    # A restarted producer that reuses its member id and starts at sequence 0 again is
    # dropped as a duplicate (docs/wire-format.md, EventIDs); a fresh member id is applied.
    fixed = "java-writer.fixed"
    assert _publish(kafka_bootstrap_servers, namespace, "put", "d", "1", member=fixed) == [
        ("PUT", "d", "CREATE", False)
    ]
    again = _publish(kafka_bootstrap_servers, namespace, "put", "d", "2", member=fixed)
    assert [duplicate for _, _, _, duplicate in again] == [True]
    assert reader.get("d") == 1
    assert _publish(kafka_bootstrap_servers, namespace, "put", "d", "3") == [
        ("PUT", "d", "UPDATE", False)
    ]
    reader.local_destroy("d")  # read the server's value, not the one this cache kept
    assert reader.get("d") == 3


def _write_every_record_again(bootstrap: str, topic: str, partitions: set[int]) -> int:
    """Produce each record of the partitions once more, key, headers and value unchanged
    (what a producer's retry or a server's re-send after a failover looks like)."""
    consumer = kafka_consumer(
        {"bootstrap.servers": bootstrap, "group.id": "wire-test", "enable.auto.commit": False}
    )
    records: list[tuple[int, Any, Any, Any]] = []
    try:
        for partition in sorted(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            consumer.assign([TopicPartition(topic, partition, low)])
            offset = low
            while offset < high:
                for message in consumer.consume(500, 0.5):
                    if message.error() is None:
                        offset = (message.offset() or 0) + 1
                        records.append(
                            (partition, message.key(), message.value(), message.headers())
                        )
    finally:
        consumer.close()
    producer = kafka_producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition, key, value, headers in records:
        producer.produce(topic, value, key, partition=partition, headers=headers)
    assert producer.flush(30) == 0
    return len(records)


def _read(bootstrap: str, namespace: str, client_id: str) -> tuple[list[Any], dict[str, Any]]:
    status, lines = _java(
        "read",
        *("--bootstrap", bootstrap, "--namespace", namespace, "--client-id", client_id),
    )
    assert status == 0, lines
    *events, summary = lines
    assert summary["type"] == "summary" and summary["reached_end"]
    return [(e["kind"], e["key"], e["value"], e["shared"]) for e in events], summary


def test_the_java_reader_gets_each_event_of_a_client_once_from_the_shared_queue_topic(
    cache_server: CacheServer,
    client_factory: ClientFactory,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    # Two subscribers of one partition share a record per event (key NUL + CRC, rb.to); a
    # subscriber alone in its partition gets records keyed by its id.
    pair = _ids_sharing_a_partition(2, "pair")
    solo = next(
        f"solo-{n}"
        for n in range(100)
        if client_partition(f"solo-{n}", DEFAULT_CLIENT_PARTITIONS)
        != client_partition(pair[0], DEFAULT_CLIENT_PARTITIONS)
    )
    recorders: dict[str, Recorder] = {}
    regions = {}
    for client_id in (*pair, solo):
        recorders[client_id] = Recorder()
        cache = client_factory(client_id=client_id)
        regions[client_id] = cache.create_region("r", listeners=[recorders[client_id]])
        regions[client_id].register_interest(ALL_KEYS)
    writer = client_factory(subscription_enabled=False).create_region("r")
    writer.put("p1", {"n": 1})
    writer.put("p2", "two")
    regions[pair[0]].put("own", 5)
    for client_id in (pair[1], solo):
        wait_until(
            lambda c=client_id: len(recorders[c].snapshot()) == 3,  # type: ignore[misc]
            what=f"{client_id}'s events",
        )

    topic = Topics(namespace).client_queues(None)
    partitions = {client_partition(c, DEFAULT_CLIENT_PARTITIONS) for c in (*pair, solo)}
    assert _write_every_record_again(kafka_bootstrap_servers, topic, partitions) > 0

    everything = [("CREATE", "p1", '{"n":1}'), ("CREATE", "p2", '"two"'), ("CREATE", "own", "5")]
    for client_id, shared, expected in (
        (pair[0], True, everything[:2]),  # its own change is left out of the shared record
        (pair[1], True, everything),
        (solo, False, everything),
    ):
        events, summary = _read(kafka_bootstrap_servers, namespace, client_id)
        assert events == [(*e, shared) for e in expected], client_id
        assert summary["duplicates_dropped"] == len(expected), client_id


def test_events_framed_for_standard_avro_tools_are_read_by_avros_own_decoder(
    server_settings: ServerSettings,
    client_factory: ClientFactory,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    server = CacheServer(
        server_settings.model_copy(update={"events_framing": "avro-single-object"})
    )
    server.start()
    try:
        # Written with Avro's own single-object encoder, the operations are applied too.
        replies = _publish(
            kafka_bootstrap_servers,
            namespace,
            *("put", "java", '{"n":1}', "put", "gone", "0", "destroy", "gone"),
            framing="avro-single-object",
        )
        assert [kind for _, _, kind, _ in replies] == ["CREATE", "CREATE", "DESTROY"]
        writer = client_factory(client_id="py-writer", subscription_enabled=False)
        writer.create_region("r").put("python", "two")
        status, lines = _java(
            "events", "--bootstrap", kafka_bootstrap_servers, "--namespace", namespace
        )
    finally:
        server.stop()
    assert status == 0, lines
    found = sorted((e["key"], e["kind"], e["value"], e["originator"]) for e in lines)
    assert found == [
        ("gone", "CREATE", "0", "java-writer"),
        ("gone", "DESTROY", None, "java-writer"),
        ("java", "CREATE", '{"n":1}', "java-writer"),
        ("python", "CREATE", '"two"', "py-writer"),
    ]
    assert {e["framing"] for e in lines} == {"avro-single-object"}
