"""Spark batch reads of regionbus topics: exactly what was produced, decoded into columns."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from pyspark.sql import functions as F  # noqa: N812
from readme_commands import REPOSITORY, block_containing, run_python
from support import wait_until
from test_interest_groups import _ids_sharing_a_partition

from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.schemas.addressing import RECIPIENTS_HEADER, is_shared, recipient_ids, shared_key
from regionbus.schemas.codec import decode, encode, encode_batches
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_admin, kafka_producer
from regionbus.schemas.messages import (
    Control,
    ControlKind,
    Event,
    EventKind,
    Marker,
    Operation,
    OperationKind,
    Reply,
)
from regionbus.schemas.naming import Topics
from regionbus.schemas.serializers import AvroSerializer
from regionbus.spark.decode import (
    ADDRESS_SCHEMA,
    DECODED_SCHEMA,
    decode_messages,
    decode_record_values,
    decode_values,
    read_messages,
)
from regionbus.spark.format import JVM_FORMAT, jvm_connector_present, kafka_format
from regionbus.spark.kafka import earliest_offsets, latest_offsets, offsets_for_timestamps
from regionbus.spark.source import SOURCE_NAME

_PARTITIONS = 3
SPARK_DOC = REPOSITORY / "docs" / "spark.md"


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = kafka_admin({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=15)


def _produce(bootstrap: str, topic: str, count: int, linger_ms: int) -> dict[tuple[int, int], Any]:
    """Produce ``count`` records spread over the partitions, every third with headers;
    return what Kafka acknowledged, by ``(partition, offset)``."""
    producer = kafka_producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms})
    acked: dict[tuple[int, int], Any] = {}
    sent: dict[bytes, tuple[bytes | None, list[tuple[str, bytes]] | None]] = {}

    def on_delivery(error: Any, message: Any) -> None:
        assert error is None, error
        key, headers = sent[message.value()]
        acked[(message.partition(), message.offset())] = (key, message.value(), headers)

    for i in range(count):
        value = f"value-{i}".encode()
        key = f"key-{i}".encode() if i % 5 else None
        headers = [("n", str(i).encode()), ("kind", b"test")] if i % 3 == 0 else None
        sent[value] = (key, headers)
        producer.produce(
            topic, value, key, partition=i % _PARTITIONS, headers=headers, on_delivery=on_delivery
        )
    assert producer.flush(30) == 0
    assert len(acked) == count
    return acked


def _read(spark: Any, bootstrap: str, **options: str) -> list[Any]:
    reader = spark.read.format(kafka_format(spark)).option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().collect()


def test_batch_read_equals_what_was_produced_across_partitions_with_headers(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = Topics(namespace).events
    _create_topic(kafka_bootstrap_servers, topic, _PARTITIONS)
    # Linger makes multi-record batches: the end of a partition is still its last record's
    # offset + 1, the high watermark the source reads up to.
    produced = _produce(kafka_bootstrap_servers, topic, 3_000, linger_ms=50)
    config = {"bootstrap.servers": kafka_bootstrap_servers}
    partitions = [(topic, p) for p in range(_PARTITIONS)]

    rows = _read(spark_session, kafka_bootstrap_servers, subscribe=topic, includeHeaders="true")

    assert earliest_offsets(config, partitions) == {tp: 0 for tp in partitions}
    assert latest_offsets(config, partitions) == {
        (topic, p): sum(1 for q, _ in produced if q == p) for p in range(_PARTITIONS)
    }

    read = {
        (r.partition, r.offset): (
            r.key,
            r.value,
            [(h.key, h.value) for h in r.headers] if r.headers is not None else None,
        )
        for r in rows
    }
    assert len(rows) == len(read), "a record was read twice"
    assert read == produced
    assert {r.topic for r in rows} == {topic}
    assert all(r.timestampType == 0 and r.timestamp is not None for r in rows)
    for partition in range(_PARTITIONS):
        offsets = sorted(o for p, o in read if p == partition)
        assert offsets == list(range(len(offsets))), f"gap in partition {partition}"


def test_batch_read_honours_offset_json_pattern_and_assign(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = f"{namespace}.gw.site2"
    _create_topic(kafka_bootstrap_servers, topic, _PARTITIONS)
    produced = _produce(kafka_bootstrap_servers, topic, 300, linger_ms=20)

    ranged = _read(
        spark_session,
        kafka_bootstrap_servers,
        subscribePattern=re.escape(namespace) + r"\.gw\..*",
        startingOffsets=json.dumps({topic: {"0": 10, "1": -2, "2": 95}}),
        endingOffsets=json.dumps({topic: {"0": 20, "1": 5, "2": -1}}),
    )
    assigned = _read(spark_session, kafka_bootstrap_servers, assign=json.dumps({topic: [1]}))

    assert sorted((r.partition, r.offset) for r in ranged) == [
        *((0, o) for o in range(10, 20)),
        *((1, o) for o in range(5)),
        *((2, o) for o in range(95, 100)),
    ]
    assert sorted((r.partition, r.offset) for r in assigned) == sorted(
        k for k in produced if k[0] == 1
    )
    assert "headers" not in assigned[0].asDict()


def test_timestamp_options_start_and_end_at_the_first_record_that_recent(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = f"{namespace}.aeq.by-time"
    _create_topic(kafka_bootstrap_servers, topic, _PARTITIONS)
    base_ms = int(time.time() * 1000) - 600_000
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    for partition in range(_PARTITIONS):
        for i in range(10):
            producer.produce(
                topic,
                f"{partition}-{i}".encode(),
                partition=partition,
                timestamp=base_ms + i * 1000,
            )
    assert producer.flush(30) == 0
    config = {"bootstrap.servers": kafka_bootstrap_servers}

    def read(**options: str) -> list[tuple[int, int]]:
        rows = _read(spark_session, kafka_bootstrap_servers, subscribe=topic, **options)
        return sorted((r.partition, r.offset) for r in rows)

    def by_partition(*timestamps_ms: int) -> str:
        return json.dumps({topic: {str(p): t for p, t in enumerate(timestamps_ms)}})

    # Offsets 0-9 of every partition carry base + 0 s ... base + 9 s.
    assert offsets_for_timestamps(
        config, [(topic, 0), (topic, 1)], base_ms + 2500, when_none="latest"
    ) == {(topic, 0): 3, (topic, 1): 3}
    windowed = read(
        startingTimestamp=str(base_ms + 3000),
        endingOffsetsByTimestamp=by_partition(base_ms + 5000, base_ms + 99_000, base_ms + 3000),
    )
    to_the_end = read(
        startingOffsetsByTimestamp=by_partition(base_ms + 9000, base_ms + 20_000, base_ms),
        startingOffsetsByTimestampStrategy="latest",
    )

    assert windowed == [(0, 3), (0, 4), *((1, o) for o in range(3, 10))]
    assert to_the_end == [(0, 9), *((2, o) for o in range(10))]
    with pytest.raises(Exception, match="No offset matched from request of topic-partition"):
        read(startingOffsetsByTimestamp=by_partition(base_ms, base_ms + 20_000, base_ms))
    with pytest.raises(Exception, match=r"you didn.t specify all the partitions"):
        read(startingOffsetsByTimestamp=json.dumps({topic: {"0": base_ms}}))


def test_events_topic_decodes_into_typed_columns(
    spark_session: Any,
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    cache = client_factory()
    region = cache.create_region("r")
    entries = {f"k{i}": {"n": i, "name": f"entry {i}", "tags": [i, i + 1]} for i in range(200)}
    region.put_all(entries)
    region.put("k0", {"n": -1, "name": "updated", "tags": []})
    region.destroy("k1")
    topic = Topics(namespace).events

    def read_events() -> list[Any]:
        raw = (
            spark_session.read.format(kafka_format(spark_session))
            .option("kafka.bootstrap.servers", kafka_bootstrap_servers)
            .option("subscribe", topic)
            .load()
        )
        decoded = decode_values(decode_messages(raw), "n bigint, name string, tags array<bigint>")
        return decoded.collect()

    rows: list[Any] = []

    def all_there() -> bool:
        rows[:] = read_events()
        return len(rows) >= 202

    wait_until(all_there, timeout_s=60, what="202 events in {ns}.events")
    assert len(rows) == 202
    assert all(r.decode_error is None and r.message_type == "Event" for r in rows)
    assert all(r.region == "r" and r.originator == cache.client_id for r in rows)
    creates = {r.key: r for r in rows if r.operation == "CREATE"}
    assert set(creates) == set(entries)
    assert {k: r.entry.asDict() for k, r in creates.items()} == entries
    (update,) = [r for r in rows if r.operation == "UPDATE"]
    assert (update.key, update.entry.n, update.entry.name, update.entry.tags) == (
        "k0",
        -1,
        "updated",
        [],
    )
    (destroy,) = [r for r in rows if r.operation == "DESTROY"]
    assert destroy.key == "k1" and destroy.value is None and destroy.entry is None
    # EventIDs: one member and thread for the client, consecutive per thread, in its bucket.
    assert {(r.member, r.thread) for r in rows} == {(rows[0].member, rows[0].thread)}
    assert sorted(r.sequence for r in rows) == list(range(202))
    assert all(0 <= r.bucket < 16 and r.bucket == r.partition for r in rows)


def test_queue_rows_name_the_clients_they_are_for(
    spark_session: Any,
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    # Three clients of one registration in one partition share each event's record; the
    # fourth, alone in its group (invalidations only), gets records keyed by its id.
    ids = _ids_sharing_a_partition(4, "reader")
    for client_id in ids:
        region = client_factory(client_id=client_id).create_region("r")
        region.register_interest(ALL_KEYS, receive_values=client_id != ids[3])
    writer = client_factory(subscription_enabled=False).create_region("r")
    for i in range(3):
        writer.put(f"k{i}", i)
    rows: list[Any] = []

    def all_there() -> bool:
        # docs/spark.md's attribution, as written: a record for several clients lists them
        # in rb.to, a record for one is keyed by its id.
        names = run_python(
            block_containing(SPARK_DOC, '"client_id"'),
            {
                '"127.0.0.1:9092"': json.dumps(kafka_bootstrap_servers),
                '"regionbus.queues"': json.dumps(Topics(namespace).client_queues(None)),
            },
            {"spark": spark_session, "read_messages": read_messages},
        )
        rows[:] = names["per_client"].where(F.col("region") == "r").collect()
        return len(rows) >= 12

    wait_until(all_there, timeout_s=60, what="the 12 events of 4 clients in {ns}.queues")

    assert len(rows) == 12
    shared = [r for r in rows if r.recipients is not None]
    own = [r for r in rows if r.recipients is None]
    (group_key,) = {bytes(r.record_key) for r in shared}  # a NUL byte and 8 hex digits
    assert is_shared(group_key) and len(group_key) == 9
    assert len(shared) == 9 and all(r.recipients == ids[:3] for r in shared)
    assert [(bytes(r.record_key), r.operation) for r in own] == [
        (ids[3].encode(), "INVALIDATE")
    ] * 3
    by_client: dict[str, list[tuple[str, str]]] = {}
    for r in sorted(rows, key=lambda r: r.offset):
        by_client.setdefault(r.client_id, []).append((r.key, r.operation))
    creates = [(f"k{i}", "CREATE") for i in range(3)]
    assert by_client == {
        **dict.fromkeys(ids[:3], creates),
        ids[3]: [(f"k{i}", "INVALIDATE") for i in range(3)],
    }


def test_undecodable_records_become_rows_with_the_error(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = Topics(namespace).events
    _create_topic(kafka_bootstrap_servers, topic, 1)
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(topic, b"not a regionbus message", partition=0)
    producer.produce(topic, bytes((0xB1, 2, 0xFF)), partition=0)
    assert producer.flush(10) == 0

    raw = (
        spark_session.read.format(kafka_format(spark_session))
        .option("kafka.bootstrap.servers", kafka_bootstrap_servers)
        .option("subscribe", topic)
        .load()
    )
    rows = decode_messages(raw).orderBy("offset").collect()

    assert [r.offset for r in rows] == [0, 1]
    assert "magic" in rows[0].decode_error
    assert "undecodable Event" in rows[1].decode_error
    assert all(r.message_type is None for r in rows)


def test_sessions_read_with_the_jvm_connector_and_the_python_source_stays_available(
    spark_session: Any,
) -> None:
    assert jvm_connector_present(spark_session)
    assert kafka_format(spark_session) == JVM_FORMAT
    assert kafka_format(spark_session, prefer_jvm=False) == SOURCE_NAME
    schemas = [
        spark_session.read.format(fmt)
        .option("kafka.bootstrap.servers", "127.0.0.1:9")
        .option("subscribe", "x")
        .option("includeHeaders", "true")
        .load()
        .schema.simpleString()
        for fmt in (JVM_FORMAT, SOURCE_NAME)
    ]
    assert (
        schemas
        == [
            "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
            "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
        ]
        * 2
    )


def _every_kind_of_record() -> list[bytes | None]:
    eid = EventID("m\u00e9mber", -(2**63), 2**63 - 1, 2**31 - 1)
    messages: list[Any] = [
        Event(eid, EventKind.CREATE, "r", 1, 1_700_000_000_000, "c1", "k", b'{"a": 1}', "json"),
        Event(eid, EventKind.DESTROY, "r", 2, 0, "c2", None, None, None, True, b"cb", 7, (1, 2)),
        Operation(5, "c3", OperationKind.PUT, "r", 9, eid, "k2", b"v", "str", None, True),
        Operation(6, "c4", OperationKind.REGISTER_INTEREST, "r", 10),
        Reply(7, 3, True, event_kind=EventKind.UPDATE, version=4, value=b"x", serializer="bytes"),
        Reply(8, -1, False, error_type="RegionNotFoundError", error_message="no"),
        Control(ControlKind.PING, "c5", 11, "durable", 30, True, 12, "conn"),
        Marker("c6", 13, 2, "conn"),
    ]
    framed = [encode(m) for m in messages]
    return [
        *framed,
        *encode_batches([*framed[:2], framed[7]]),  # a queue's batch: events and a marker
        bytes((0xB1, 6, 0)),  # an empty batch
        bytes((0xB1, 6, 0x03, 0xFF)),  # a batch whose array does not parse
        encode_batches([framed[0], b"garbage", bytes((0xB1, 2, 0xFF))])[0],
        b"not a regionbus message",
        bytes((0xB1, 2, 0xFF)),  # a truncated Event
        bytes((0xB1, 9, 0)),  # an unknown type byte
        bytes((0xB1,)),
        b"",
        None,
    ]


_HEADERS: list[list[tuple[str, bytes]] | None] = [
    None,
    [],
    [(RECIPIENTS_HEADER, b"\x00c-1\x00c-2\x00")],
    [("rb.mac", b"\x00x\x00"), (RECIPIENTS_HEADER, "\x00c\u00e9\x00".encode())],
    [(RECIPIENTS_HEADER, b"")],
    [(RECIPIENTS_HEADER, b"\x00first\x00"), (RECIPIENTS_HEADER, b"\x00second\x00")],
]
"""Header lists a record may carry: none, no ``rb.to``, a list of two, another header
first, an empty list, and two ``rb.to`` (the first one counts, as for the clients)."""


def test_jvm_decoding_gives_the_rows_of_the_python_reference_decoder(
    spark_session: Any,
) -> None:
    values = _every_kind_of_record()
    source_rows, columns = decode_record_values(values)
    names = [f.name for f in DECODED_SCHEMA.fields]
    keys = [f"c-{i}".encode() if i % 4 else shared_key(str(i)) for i in range(len(values))]
    headers = [_HEADERS[i % len(_HEADERS)] for i in range(len(values))]
    expected = sorted(
        (row, keys[row], recipient_ids(headers[row]), *(c[i].as_py() for c in columns))
        for i, row in enumerate(source_rows)
    )
    records = spark_session.createDataFrame(
        [(i, keys[i], v, headers[i]) for i, v in enumerate(values)],
        "offset int, key binary, value binary, headers array<struct<key:string,value:binary>>",
    )

    decoded = decode_messages(records).collect()

    assert [tuple(r.asDict()) for r in decoded[:1]] == [("offset", *ADDRESS_SCHEMA.names, *names)]
    assert {tuple(r.recipients or ()) for r in decoded} == {
        (),
        ("c-1", "c-2"),
        ("c\u00e9",),
        ("first",),
    }
    found = sorted(tuple(r) for r in decoded)

    # Error texts differ in their detail (fastavro's exception vs "undecodable <type>");
    # whether a row is an error, and everything else, is the same.
    def errors_blurred(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return [(*r[:-1], r[-1] is not None) for r in rows]

    assert errors_blurred(found) == errors_blurred(expected)
    assert [r[-1] for r in found if r[-1] is not None][:1]
    by_offset = {r.offset: r for r in decoded if r.decode_error}
    assert "magic 0x6e" in by_offset[len(values) - 6].decode_error
    assert by_offset[len(values) - 5].decode_error == "undecodable Event"


def test_records_in_avros_single_object_encoding_decode_as_their_regionbus_frames(
    spark_session: Any,
) -> None:
    """The framing servers write ``{ns}.events`` in with ``events_framing =
    avro-single-object`` decodes in the JVM to the rows of the regionbus frame, batches and
    their items included; a single object of another schema is an error row."""
    values = [v for v in _every_kind_of_record()[:8] if v is not None]
    single = [encode(decode(v), "avro-single-object") for v in values]
    batches = [
        encode_batches(values[:2], framing="avro-single-object")[0],
        encode_batches(single[:2])[0],
    ]
    foreign = b"\xc3\x01" + bytes(8) + b"\x00"

    def rows(records: list[bytes]) -> list[tuple[Any, ...]]:
        frame = spark_session.createDataFrame(
            [(i, v) for i, v in enumerate(records)], "offset int, value binary"
        )
        return sorted(tuple(r) for r in decode_messages(frame).collect())

    regionbus_rows = rows([*values, *encode_batches(values[:2]) * 2])
    assert rows([*single, *batches]) == regionbus_rows
    [error] = rows([foreign])
    assert error[-1] is not None


def test_avro_values_of_a_typed_region_decode_in_the_jvm(spark_session: Any) -> None:
    schema = {
        "type": "record",
        "name": "Flight",
        "namespace": "demo",
        "fields": [
            {"name": "carrier", "type": "string"},
            {"name": "dep_delay", "type": ["null", "double"], "default": None},
            {"name": "legs", "type": {"type": "array", "items": "int"}},
        ],
    }
    avro = AvroSerializer(schema)
    eid = EventID("m", 1, 0, 0)
    flights = {"f1": {"carrier": "UA", "dep_delay": 12.5, "legs": [1, 2]}}
    flights["f2"] = {"carrier": "AA", "dep_delay": None, "legs": []}
    values = [
        encode(Event(eid, EventKind.CREATE, "r", 1, 0, "c", k, avro.dumps(v), avro.name))
        for k, v in flights.items()
    ]
    values.append(encode(Event(eid, EventKind.CREATE, "r", 1, 0, "c", "j", b"{}", "json")))
    broken = b"\x7f\xff"  # a string length running past the end
    values.append(encode(Event(eid, EventKind.CREATE, "r", 1, 0, "c", "bad", broken, avro.name)))
    records = spark_session.createDataFrame([(v,) for v in values], "value binary")

    rows = decode_values(
        decode_messages(records),
        "carrier string, dep_delay double, legs array<int>, missing string",
        avro_schema=schema,
        output_column="flight",
    ).collect()

    got = {r.key: r.flight.asDict() if r.flight is not None else None for r in rows}
    assert got == {
        "f1": {**flights["f1"], "missing": None},
        "f2": {**flights["f2"], "missing": None},
        "j": None,
        "bad": None,
    }


def test_the_python_source_reads_what_the_connector_reads(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = Topics(namespace).events
    _create_topic(kafka_bootstrap_servers, topic, _PARTITIONS)
    _produce(kafka_bootstrap_servers, topic, 300, linger_ms=20)

    def read(fmt: str) -> list[tuple[Any, ...]]:
        rows = (
            spark_session.read.format(fmt)
            .option("kafka.bootstrap.servers", kafka_bootstrap_servers)
            .option("subscribe", topic)
            .load()
            .collect()
        )
        return sorted((r.partition, r.offset, r.key, r.value, r.timestamp) for r in rows)

    native = read(kafka_format(spark_session))
    python = read(kafka_format(spark_session, prefer_jvm=False))

    assert len(native) == 300
    assert python == native
