"""Invariant 6 under fuzz: garbage on every topic a regionbus worker consumes kills none of
them, valid traffic around it is applied, and every broken message on a server or gateway
topic is dead-lettered with its reason.

Topics fuzzed, with a seeded ``random.Random`` (the same messages every run): site A's
``{ns}.ops`` and ``{ns}.control`` (cache server), a client's partition of the shared
``{ns}.queues`` and ``{ns}.replies`` (ClientCache), ``{ns}.gw.<sender>`` (gateway sender queue),
``{ns}.aeq.<queue>`` (async event queue); site B's ``{ns}.gwr.<receiver>`` (gateway
receiver) and the sender's ack topic ``{ns}.gwack.<site>.<sender>``. The garbage: random
bytes, empty and null values, truncated, byte-flipped, retyped and re-magicked valid frames,
valid frames of the wrong record type for the topic, and garbage headers.

A client has no dead-letter rights in a secured setup, so it logs and counts what it skips
(``SubscriptionStats.undecodable``, ``Pool.undecodable_replies``) instead.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from gateway_sites import Site, running_sites, start_async_event_queue
from support import Recorder, bystander_puts, dead_letters, wait_until

from regionbus.clients import ALL_KEYS
from regionbus.gateways.async_event_queue import AsyncEvent, AsyncEventListener
from regionbus.gateways.protocol import (
    GatewayAck,
    GatewayBatch,
    decode_ack,
    decode_batch,
    encode_ack,
    encode_batch,
)
from regionbus.schemas.codec import (
    decode,
    decode_as,
    encode,
    encode_batches,
    split_batch,
)
from regionbus.schemas.errors import MessageDecodeError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.messages import (
    Control,
    ControlKind,
    Event,
    EventKind,
    InterestKind,
    InterestSpec,
    Marker,
    Message,
    Operation,
    OperationKind,
    Reply,
)
from regionbus.schemas.naming import Topics, bucket_of
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.record_limits import CONTROL_BATCH_MAX_BYTES, RECORD_BATCH_MAX_BYTES
from regionbus.schemas.topics import TopicSpec, ensure_topics
from regionbus.schemas.transport import poll_batch
from regionbus.spark.decode import decode_record_values

pytestmark = pytest.mark.abuse

SEED = 20_240_607
MESSAGES_PER_TOPIC = 40
FUZZ_MEMBER = "fuzz-member"
"""Member id of every valid frame the fuzz starts from: message tracking and the servers'
EventID dedup are per member, so mutated copies never shadow real events."""


class _Collecting(AsyncEventListener):
    def __init__(self) -> None:
        self.keys: list[str | None] = []

    def process_events(self, events: list[AsyncEvent]) -> bool:
        self.keys.extend(e.key for e in events)
        return True


def _samples(namespace: str) -> dict[str, bytes]:
    """Valid frames of every record type, harmless when applied (fuzz member, region or
    client ids that no real traffic uses)."""
    now_ms = int(time.time() * 1000)
    eid = EventID(FUZZ_MEMBER, 7, 2**33, 3)
    records: dict[str, Message] = {
        "operation": Operation(
            request_id=2**40,
            client_id="fuzz-client",
            kind=OperationKind.KEYS,
            region="fuzz-region",
            timestamp_ms=now_ms,
        ),
        "event": Event(
            eid, EventKind.UPDATE, "r", 5, now_ms, "fuzz-client", "fuzz-key", b'"fuzz"', "json"
        ),
        "reply": Reply(request_id=2**40, bucket=3, ok=True, value=b"1", serializer="json"),
        "control": Control(ControlKind.PING, "fuzz-client", now_ms, request_id=0),
        "marker": Marker("fuzz-client", now_ms, 3, "fuzz-connection"),
    }
    frames = {name: encode(record) for name, record in records.items()}
    frames["batch"] = encode_batches([frames["reply"], frames["marker"]])[0]
    frames["gateway_batch"] = encode_batch(
        GatewayBatch(
            "fuzz-1",
            "fuzz-sender",
            9,
            Topics(namespace).gateway_ack(9, "fuzz-sender"),
            False,
            (frames["event"],),
        )
    )
    frames["gateway_ack"] = encode_ack(GatewayAck("fuzz-1", "fuzz-receiver", 1))
    return frames


BAD_CLIENT = 'fuzz "client"'
"""A client id no topic name can hold: a worker replying to it must not die of that."""


def _hostile(namespace_ops: str, namespace_control: str) -> list[tuple[str, int, bytes]]:
    """Frames that decode but are semantically bad: ``(topic, partition, value)``."""
    now_ms = int(time.time() * 1000)
    key = "fuzz-k"
    bucket = bucket_of("r", key, 16)
    eid = EventID(FUZZ_MEMBER, 8, 1, bucket)
    put = Operation(1, BAD_CLIENT, OperationKind.PUT, "r", now_ms, eid, key, b"1", "json")
    regex = InterestSpec(InterestKind.REGEX, regex="(unclosed")
    return [
        (
            namespace_control,
            0,
            encode(Control(ControlKind.CONNECT, BAD_CLIENT, now_ms, request_id=5)),
        ),
        (namespace_control, 0, encode(Control(ControlKind.PING, BAD_CLIENT, now_ms, request_id=6))),
        (namespace_control, 0, encode(Control(ControlKind.CLOSE, BAD_CLIENT, now_ms))),
        (namespace_ops, bucket, encode(put)),
        (
            namespace_ops,
            bucket,
            encode(put._replace(event_id=eid._replace(sequence=2), kind=OperationKind.GET)),
        ),
        (
            namespace_ops,
            0,
            encode(put._replace(kind=OperationKind.READY_FOR_EVENTS, key=None, event_id=None)),
        ),
        (
            namespace_ops,
            0,
            encode(
                put._replace(
                    kind=OperationKind.REGISTER_INTEREST, key=None, event_id=None, interest=regex
                )
            ),
        ),
        (
            namespace_ops,
            bucket,
            encode(put._replace(event_id=eid._replace(sequence=3), value=b"x" * (600 * 1024))),
        ),
    ]


def _fuzz(
    rng: random.Random, frames: dict[str, bytes], right: str, count: int
) -> list[tuple[bytes | None, list[tuple[str, str | bytes | None]]]]:
    """``count`` broken or foreign messages for a topic whose record type is ``right``;
    each is ``(value, headers)``. The last one is always undecodable (a fence to wait for)."""
    wrong = [name for name in frames if name != right]
    out: list[tuple[bytes | None, list[tuple[str, str | bytes | None]]]] = []
    for _ in range(count):
        how = rng.choice(
            ["random", "empty", "truncate", "flip", "retype", "magic", "wrong", "flip", "random"]
        )
        base = frames[right]
        value: bytes | None
        if how == "random":
            value = rng.randbytes(rng.randint(1, 200))
        elif how == "empty":
            value = rng.choice([b"", None, b"\xb1"])
        elif how == "truncate":
            value = base[: rng.randint(0, len(base) - 1)]
        elif how == "flip":
            i = rng.randrange(len(base))
            value = base[:i] + bytes([base[i] ^ rng.randint(1, 255)]) + base[i + 1 :]
        elif how == "retype":
            value = (
                base[:1] + bytes([rng.choice([0, 7, 0x22, 0xFF, rng.randint(0, 255)])]) + base[2:]
            )
        elif how == "magic":
            value = bytes([rng.randint(0, 0xB0)]) + base[1:]
        else:
            value = frames[rng.choice(wrong)]
        headers: list[tuple[str, str | bytes | None]] = []
        if rng.random() < 0.3:
            headers = [
                (
                    rng.choice(["rb.principal", "rb.ts", "rb.mac", "x"]),
                    rng.choice([None, rng.randbytes(8)]),
                )
                for _ in range(rng.randint(1, 4))
            ]
        out.append((value, headers))
    out[-1] = (b"\xb1\x02fence: not an event", [])
    return out


def _broken_items(value: bytes | None, accepts: Callable[[bytes], bool]) -> list[bytes | None]:
    """What a worker must dead-letter of one message: the whole value when it is not even a
    batch frame or holds several items that do not decode into the topic's record type
    (one dead letter per message, however many), else that one item."""
    try:
        items = split_batch(value)
    except MessageDecodeError:
        return [value]
    broken = [item for item in items if not accepts(item)]
    return [value] if len(broken) > 1 else broken


def _decodes_as(*types: type) -> Callable[[bytes], bool]:
    def accepts(item: bytes) -> bool:
        try:
            return isinstance(decode(item), types)
        except MessageDecodeError:
            return False

    return accepts


def _event_only(value: bytes | None) -> Event:
    return decode_as(value, Event)


def _whole(decoder: Callable[[bytes | None], Any]) -> Callable[[bytes | None], list[bytes | None]]:
    """For the single-record gateway topics: the whole value is broken or it is not."""

    def broken(value: bytes | None) -> list[bytes | None]:
        try:
            decoder(value)
        except MessageDecodeError:
            return [value]
        return []

    return broken


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


@dataclass
class _EveryWorker:
    """Every kind of worker that consumes a topic, running: site A's server with gateway
    sender ``to-b`` and async event queue ``audit``, site B's server and receiver, and a
    client of A subscribed to every key of region ``r``, with a writer."""

    workers: dict[str, Any]
    sender: Any
    listener: _Collecting
    cache: Any
    recorder: Recorder
    region: Any
    writer: Any

    def assert_alive(self) -> None:
        for name, worker in self.workers.items():
            assert worker.alive, f"{name} died: {worker.failure!r}"


def _start_every_worker(a: Site, b: Site) -> _EveryWorker:
    b.start_server()
    receiver = b.start_receiver()
    server = a.start_server(senders={"to-b": 2}, async_event_queues=("audit",))
    sender = a.start_sender("to-b", b, batch_time_interval_ms=100)
    listener = _Collecting()
    queue = start_async_event_queue(a, "audit", listener)
    cache = a.client()
    recorder = Recorder()
    region = cache.create_region("r", listeners=[recorder])
    region.register_interest(ALL_KEYS)
    workers = {
        "server A": server,
        "server B": b.server,
        "gateway sender": sender,
        "gateway receiver": receiver,
        "async event queue": queue,
    }
    writer = a.client().create_region("r")
    return _EveryWorker(workers, sender, listener, cache, recorder, region, writer)


def test_fuzz_on_every_consumed_topic_kills_no_worker_and_dead_letters_every_broken_message(
    sites: list[Site],
) -> None:
    a, b = sites
    w = _start_every_worker(a, b)

    w.writer.put_all({f"before{i}": i for i in range(10)})  # valid traffic before the garbage
    wait_until(
        lambda: sum(k.startswith("before") for _, k, _ in w.recorder.snapshot()) == 10,
        30,
        "the first valid puts at the subscriber",
    )

    rng = random.Random(SEED)
    frames = _samples(b.namespace)
    is_operation, is_control = _decodes_as(Operation), _decodes_as(Control)
    # topic -> (its Kafka, partitions, the record type it carries, what must be dead-lettered)
    server_topics: dict[str, tuple[str, int, str, Callable[[bytes | None], list[bytes | None]]]] = {
        f"{a.namespace}.ops": (
            a.namespace,
            16,
            "operation",
            lambda v: _broken_items(v, is_operation),
        ),
        f"{a.namespace}.control": (
            a.namespace,
            1,
            "control",
            lambda v: _broken_items(v, is_control),
        ),
        f"{a.namespace}.gw.to-b": (a.namespace, 1, "event", _whole(_event_only)),
        f"{a.namespace}.aeq.audit": (a.namespace, 1, "event", _whole(_event_only)),
        Topics(b.namespace).gateway_inbound("receiver"): (
            b.namespace,
            1,
            "gateway_batch",
            _whole(decode_batch),
        ),
        w.sender.ack_topic: (a.namespace, 1, "gateway_ack", _whole(decode_ack)),
    }
    address = w.cache.pool.address
    client_topics = {
        (address.queue_topic, address.queue_partition): "event",
        (address.reply_topic, address.reply_partition): "reply",
    }
    producer = kafka_producer({"bootstrap.servers": a.kafka})
    expected_dead: dict[str, Counter[bytes | None]] = {}
    client_broken: dict[str, int] = {}
    every_value: list[bytes | None] = []
    for topic, (dead_ns, partitions, right, broken) in server_topics.items():
        expected_dead.setdefault(dead_ns, Counter())
        for value, headers in _fuzz(rng, frames, right, MESSAGES_PER_TOPIC):
            producer.produce(topic, value, partition=rng.randrange(partitions), headers=headers)
            expected_dead[dead_ns].update(broken(value))
            every_value.append(value)
    for (topic, partition), right in client_topics.items():
        accepts = _decodes_as(Event, Marker) if right == "event" else _decodes_as(Reply)
        fuzz = _fuzz(rng, frames, right, MESSAGES_PER_TOPIC)
        for value, headers in fuzz:
            # Addressed to the client (its key): garbage for others is not its to read.
            producer.produce(topic, value, address.key, partition=partition, headers=headers)
            every_value.append(value)
        client_broken[right] = sum(len(_broken_items(v, accepts)) for v, _ in fuzz)
    for topic, partition, value in _hostile(f"{a.namespace}.ops", f"{a.namespace}.control"):
        producer.produce(topic, value, partition=partition)
        expected_dead[a.namespace][value] += 1  # every one names an impossible client id
    assert producer.flush(15) == 0
    assert sum(sum(c.values()) for c in expected_dead.values()) > 150  # mostly broken

    # The client logs and counts what it cannot decode (the fence is last on each topic).
    wait_until(
        lambda: w.cache.subscription_stats.undecodable >= client_broken["event"],
        30,
        "the client skipping the queue's garbage",
    )
    wait_until(
        lambda: w.cache.pool.undecodable_replies >= client_broken["reply"],
        30,
        "the client skipping the reply topic's garbage",
    )

    w.writer.put_all({f"after{i}": i for i in range(10)})  # valid traffic after the garbage
    w.region.put("after-own", "x")
    assert w.region.get("after3") == 3

    wait_until(
        lambda: {f"after{i}" for i in range(10)} <= {k for _, k, _ in w.recorder.snapshot()},
        60,
        "the valid puts after the garbage at the subscriber",
    )
    expected_b = {f"{p}{i}": str(i).encode() for p in ("before", "after") for i in range(10)}
    wait_until(
        lambda: expected_b.items() <= b.values().items(),
        90,
        "every valid put on site B through the gateway",
    )
    wait_until(
        lambda: {f"after{i}" for i in range(10)} <= set(w.listener.keys),
        60,
        "the async event queue w.listener",
    )
    assert a.values().keys() >= expected_b.keys() | {"after-own"}

    for dead_ns, expected in expected_dead.items():

        def all_dead_lettered(ns: str = dead_ns, want: Counter[bytes | None] = expected) -> bool:
            got = Counter(v for v, h in dead_letters(a.kafka, ns) if h.get("rb.reason"))
            return not (want - got)

        wait_until(all_dead_lettered, 60, f"every broken message in {dead_ns}.dead-letter")
        sources = {h["rb.source.topic"].decode() for _, h in dead_letters(a.kafka, dead_ns)}
        assert sources <= set(server_topics), sources

    w.assert_alive()
    # The client's two reader threads are alive: the puts after the garbage got their
    # replies and their events.

    # The Spark decode helper turns every fuzzed value into rows, one at least per value.
    source_rows, _ = decode_record_values(every_value)
    assert set(source_rows) == set(range(len(every_value)))


# --- records Kafka's client cannot read, batches no legal w.writer sends --------------------

HOSTILE_SEED = 20_260_101
HOSTILE_BOUND_S = 1.0
"""Longest a bystander's put may take while the workers deal with hostile records (grown to
ten times its baseline on a loaded machine)."""


def _bomb_producer(kafka: str) -> Any:
    """An attacker's producer: zstd, records of any size in as few batches as it can (Kafka
    checks a compressed batch's size on the wire, not decompressed)."""
    return kafka_producer(
        {
            "bootstrap.servers": kafka,
            "compression.type": "zstd",
            "message.max.bytes": 1_000_000_000,
            "batch.size": 1_000_000_000,
            "linger.ms": 100,
        }
    )


def _bombs(rng: random.Random) -> list[tuple[int, int]]:
    """``(total bytes, records)`` of record batches that decompress to more than a consumer
    takes (``receive.message.max.bytes``, 4 MiB + 64 KiB): one record, a few, or thousands
    of small ones. Not much more: the broker decompresses each batch to check it, and that
    CPU is not the workers' (``test_hostile_input.py`` writes a 200 MB one)."""
    return [(rng.choice([6, 8, 12]) * 1_000_000, rng.choice([1, 3, 500, 4000]))]


def _produced_offsets(producer: Any, topic: str, partition: int, values: list[bytes]) -> list[int]:
    offsets: list[int] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        offsets.append(message.offset())

    for value in values:
        producer.produce(topic, value, partition=partition, on_delivery=delivered)
    assert producer.flush(60) == 0
    return sorted(offsets)


def test_a_consumer_reads_every_readable_record_once_and_skips_exactly_the_unreadable_ones(
    kafka_bootstrap_servers: str, namespace: str
) -> None:
    """Good records and compression bombs of one to thousands of records, interleaved at
    random: a consumer delivers every readable record once, in order, and reports the rest
    as skipped batches covering exactly what it did not deliver."""
    rng = random.Random(HOSTILE_SEED)
    topic = f"{namespace}.guard"
    ensure_topics(kafka_admin({"bootstrap.servers": kafka_bootstrap_servers}), [TopicSpec(topic)])
    plain = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    bomber = _bomb_producer(kafka_bootstrap_servers)
    good: list[int] = []
    bad: set[int] = set()
    for segment in range(14):
        if segment % 2 == 0:
            values = [f"good-{segment}-{i}".encode() for i in range(rng.randint(1, 40))]
            good += _produced_offsets(plain, topic, 0, values)
        else:
            for total, count in _bombs(rng):
                batch = [b"\0" * (total // count)] * count
                bad.update(_produced_offsets(bomber, topic, 0, batch))
    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka_bootstrap_servers,
            "group.id": f"{namespace}.guard",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    high = max([*good, *bad]) + 1
    delivered: list[int] = []
    skipped: list[UnreadableRecords] = []
    started = time.monotonic()
    position = 0
    while position < high:
        assert time.monotonic() - started < 120, f"stuck at {position} of {high}"
        for item in poll_batch(consumer, 500, 0.5):
            if isinstance(item, UnreadableRecords):
                skipped.append(item)
                position = item.next_offset
            elif item.error() is None:
                delivered.append(item.offset() or 0)
                position = (item.offset() or 0) + 1
    consumer.close()
    covered = [o for s in skipped for o in range(s.first_offset, s.next_offset)]
    print(
        f"{len(good)} good records, {len(bad)} bomb records in {len(skipped)} unreadable "
        f"batches: read in {time.monotonic() - started:.1f} s"
    )
    assert delivered == sorted(delivered) and len(set(delivered)) == len(delivered)
    assert set(good) <= set(delivered)
    assert set(covered) <= bad and len(covered) == len(set(covered))
    assert sorted([*delivered, *covered]) == list(range(high))  # nothing lost, none twice
    assert skipped and all("_BAD_COMPRESSION" in s.reason for s in skipped)


def _hostile_writes(
    rng: random.Random,
    topic: str,
    partitions: int,
    batch_topic: bool,
    max_bytes: int,
    partition: int | None = None,
    key: bytes | None = None,
) -> list[dict[str, Any]]:
    """What ``hostile_writer.py`` writes to one topic (to ``partition``, or to random ones of
    its ``partitions``; keyed ``key``, if given): compression bombs, a batch of as many
    empty items as the topic takes (990,000 on most; on topics that carry batches), random
    bytes, and a record over the topic's size limit."""
    writes: list[dict[str, Any]] = []
    for total, count in _bombs(rng):
        writes.append({"kind": "bomb", "total": total, "count": count})
    if batch_topic:
        writes.append({"kind": "empty_items", "count": min(990_000, max_bytes - 1_000)})
    writes.append({"kind": "value", "hex": rng.randbytes(rng.randint(1, 64)).hex()})
    writes.append({"kind": "oversize", "size": 2_000_000})
    for write in writes:
        chosen = rng.randrange(partitions) if partition is None else partition
        write.update(topic=topic, partition=chosen)
        if key is not None:
            write["key"] = key.hex()
    return writes


def _write_hostile(kafka: str, writes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``hostile_writer.py`` (its own process) with ``writes``; its results."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("hostile_writer.py")), kafka],
        input=json.dumps(writes),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def test_hostile_records_on_every_consumed_topic_stop_no_worker_and_lose_or_repeat_nothing(
    sites: list[Site],
) -> None:
    """Compression bombs, batches of 990,000 items, mis-partitioned operations, records over
    a topic's size limit and garbage on every topic a worker reads: each worker dead-letters
    (or, a client, counts) them and goes on, a bystander's puts are answered within the
    bound meanwhile, and the valid traffic after them reaches every consumer exactly once."""
    a, b = sites
    w = _start_every_worker(a, b)
    bystander = a.client().create_region("r")
    baseline_s = min(_timed_put(bystander, f"bystander-warm{i}") for i in range(3))

    rng = random.Random(HOSTILE_SEED)
    topics_a = Topics(a.namespace)
    # topic -> (partitions, carries regionbus batches, dead-lettered in which namespace)
    consumed: dict[str, tuple[int, bool, str | None]] = {
        topics_a.ops: (16, True, a.namespace),
        topics_a.control: (1, True, a.namespace),
        topics_a.gateway("to-b"): (1, False, a.namespace),
        topics_a.async_event_queue("audit"): (1, False, a.namespace),
        Topics(b.namespace).gateway_inbound("receiver"): (1, False, b.namespace),
        w.sender.ack_topic: (1, False, a.namespace),
        w.cache.pool.address.queue_topic: (16, True, None),
        w.cache.pool.address.reply_topic: (16, True, None),
    }
    # The client reads its own partition of the shared topics and the records keyed by its
    # id (others' it skips): the attacker aims at those.
    pinned = {
        w.cache.pool.address.queue_topic: w.cache.pool.address.queue_partition,
        w.cache.pool.address.reply_topic: w.cache.pool.address.reply_partition,
    }
    writes: list[dict[str, Any]] = []
    for topic, (partitions, batch_topic, _) in consumed.items():
        limit = CONTROL_BATCH_MAX_BYTES if topic == topics_a.control else RECORD_BATCH_MAX_BYTES
        writes += _hostile_writes(
            rng,
            topic,
            partitions,
            batch_topic,
            limit,
            pinned.get(topic),
            w.cache.pool.address.key if topic in pinned else None,
        )
    # Mis-partitioned: a valid put of bucket k written to another bucket's partition.
    key = "misplaced"
    bucket = bucket_of("r", key, 16)
    misplaced = Operation(
        1,
        "fuzz-client",
        OperationKind.PUT,
        "r",
        int(time.time() * 1000),
        EventID(FUZZ_MEMBER, 9, 1, bucket),
        key,
        b"1",
        "json",
    )
    wrong_partition = (bucket + 1) % 16
    writes.append(
        {
            "kind": "value",
            "hex": encode(misplaced).hex(),
            "topic": topics_a.ops,
            "partition": wrong_partition,
        }
    )
    started = time.monotonic()
    with bystander_puts(bystander, [f"bystander{i}" for i in range(8)], at_least=10) as latencies:
        results = _write_hostile(a.kafka, writes)
    unreadable: dict[str, list[tuple[int, int, int]]] = {}
    for write, result in zip(writes, results, strict=True):
        if write["kind"] == "oversize":
            # Over the topic's size limit: Kafka refuses it, so no consumer ever fetches it.
            assert result["error"] == KafkaError.MSG_SIZE_TOO_LARGE, (write["topic"], result)
            continue
        assert result["error"] is None, (write, result)
        if write["kind"] == "bomb":
            # librdkafka may send the first records as a batch of their own, small enough to
            # read (then dead-lettered as undecodable): some batch of the range is not.
            where = (write["partition"], result["offsets"][0], result["offsets"][-1])
            unreadable.setdefault(write["topic"], []).append(where)
    [misplaced_at] = results[-1]["offsets"]
    print(
        f"hostile records written in {time.monotonic() - started:.1f} s; bystander puts: "
        f"baseline {baseline_s * 1000:.0f} ms, worst {max(latencies) * 1000:.0f} ms"
    )
    assert max(latencies) <= max(HOSTILE_BOUND_S, 10 * baseline_s), latencies

    expected = {f"after{i}": i for i in range(20)}
    w.writer.put_all(expected)
    wait_until(
        lambda: expected.keys() <= {k for _, k, _ in w.recorder.snapshot()},
        90,
        "the valid puts after the hostile records at the subscriber",
    )
    wait_until(
        lambda: {k: str(v).encode() for k, v in expected.items()}.items() <= b.values().items(),
        120,
        "every valid put on site B through the gateway",
    )
    wait_until(lambda: expected.keys() <= set(w.listener.keys), 90, "the async event queue")
    creates = Counter(k for m, k, _ in w.recorder.snapshot() if m == "create" and k in expected)
    assert set(creates.values()) == {1}, creates  # none lost, none twice
    assert Counter(k for k in w.listener.keys if k in expected) == Counter(expected.keys())
    assert key not in a.values()
    wait_until(
        lambda: (
            w.cache.subscription_stats.undecodable >= 2 and w.cache.pool.undecodable_replies >= 2
        ),
        60,
        "the client skipping its topics' hostile records",
    )
    for topic, where in unreadable.items():
        dead_ns = consumed[topic][2]
        if dead_ns is None:
            continue

        def skipped(ns: str = dead_ns, t: str = topic) -> list[tuple[int, int]]:
            """(partition, first offset) of each unreadable batch of ``t`` dead-lettered."""
            return [
                (int(h["rb.source.partition"]), int(h["rb.source.offset"]))
                for v, h in dead_letters(a.kafka, ns)
                if v is None and h.get("rb.source.topic", b"").decode() == t
            ]

        def every_bomb_skipped(
            bombs: list[tuple[int, int, int]] = where,
            found: Callable[[], list[tuple[int, int]]] = skipped,
        ) -> bool:
            dead = found()
            return all(
                any(p == partition and first <= o <= last for p, o in dead)
                for partition, first, last in bombs
            )

        wait_until(every_bomb_skipped, 90, f"{topic}'s bombs dead-lettered")
        found = skipped()
        assert len(found) == len(set(found)), f"{topic}: a batch dead-lettered twice: {found}"
    misplaced_dead = [
        h
        for _, h in dead_letters(a.kafka, a.namespace)
        if h.get("rb.source.offset") == str(misplaced_at).encode()
        and h.get("rb.source.partition") == str(wrong_partition).encode()
        and h.get("rb.source.topic") == topics_a.ops.encode()
    ]
    assert misplaced_dead and b"belongs to bucket" in misplaced_dead[0]["rb.reason"]
    w.assert_alive()


def _timed_put(region: Any, key: str) -> float:
    started = time.monotonic()
    region.put(key, 1)
    return time.monotonic() - started
