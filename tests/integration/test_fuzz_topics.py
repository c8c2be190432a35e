"""Invariant 6 under fuzz: garbage on every topic a regionbus worker consumes kills none of
them, valid traffic around it is applied, and every broken message on a server or gateway
topic is dead-lettered with its reason.

Topics fuzzed, with a seeded ``random.Random`` (the same messages every run): site A's
``{ns}.ops`` and ``{ns}.control`` (cache server), a client's ``{ns}.queue.<id>`` and
``{ns}.reply.<id>`` (ClientCache), ``{ns}.gw.<sender>`` (gateway sender queue),
``{ns}.aeq.<queue>`` (async event queue); site B's ``{ns}.gwr.<receiver>`` (gateway
receiver) and the sender's ack topic ``{ns}.gwack.<site>.<sender>``. The garbage: random
bytes, empty and null values, truncated, byte-flipped, retyped and re-magicked valid frames,
valid frames of the wrong record type for the topic, and garbage headers.

A client has no dead-letter rights in a secured setup, so it logs and counts what it skips
(``SubscriptionStats.undecodable``, ``Pool.undecodable_replies``) instead.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from gateway_sites import Site, running_sites, start_async_event_queue
from support import Recorder, wait_until

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
from regionbus.schemas.codec import decode, decode_as, encode, encode_batches, split_batch
from regionbus.schemas.errors import MessageDecodeError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
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
from regionbus.spark.decode import decode_record_values

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
    batch frame, else each item that does not decode into the topic's record type."""
    try:
        items = split_batch(value)
    except MessageDecodeError:
        return [value]
    return [item for item in items if not accepts(item)]


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


def _dead_letters(kafka: str, namespace: str) -> list[tuple[bytes | None, dict[str, bytes]]]:
    """Every record of ``{ns}.dead-letter`` so far, with its headers."""
    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"fuzz-check-{time.monotonic_ns()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(f"{namespace}.dead-letter", 0, 0)])
    out: list[tuple[bytes | None, dict[str, bytes]]] = []
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                break  # partition EOF: read to the end
            headers: dict[str, bytes] = {}
            for name, raw in list(message.headers() or []):
                headers[str(name)] = raw.encode() if isinstance(raw, str) else raw or b""
            out.append((message.value(), headers))
    finally:
        consumer.close()
    return out


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def test_fuzz_on_every_consumed_topic_kills_no_worker_and_dead_letters_every_broken_message(
    sites: list[Site],
) -> None:
    a, b = sites
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
    writer = a.client().create_region("r")
    workers: dict[str, Any] = {
        "server A": server,
        "server B": b.server,
        "gateway sender": sender,
        "gateway receiver": receiver,
        "async event queue": queue,
    }

    writer.put_all({f"before{i}": i for i in range(10)})  # valid traffic before the garbage
    wait_until(
        lambda: sum(k.startswith("before") for _, k, _ in recorder.snapshot()) == 10,
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
        sender.ack_topic: (a.namespace, 1, "gateway_ack", _whole(decode_ack)),
    }
    client_topics = {
        cache.pool.topics.queue(cache.client_id): "event",
        cache.pool.topics.reply(cache.client_id): "reply",
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
    for topic, right in client_topics.items():
        accepts = _decodes_as(Event, Marker) if right == "event" else _decodes_as(Reply)
        fuzz = _fuzz(rng, frames, right, MESSAGES_PER_TOPIC)
        for value, headers in fuzz:
            producer.produce(topic, value, partition=0, headers=headers)
            every_value.append(value)
        client_broken[right] = sum(len(_broken_items(v, accepts)) for v, _ in fuzz)
    for topic, partition, value in _hostile(f"{a.namespace}.ops", f"{a.namespace}.control"):
        producer.produce(topic, value, partition=partition)
        expected_dead[a.namespace][value] += 1  # every one names an impossible client id
    assert producer.flush(15) == 0
    assert sum(sum(c.values()) for c in expected_dead.values()) > 150  # mostly broken

    # The client logs and counts what it cannot decode (the fence is last on each topic).
    wait_until(
        lambda: cache.subscription_stats.undecodable >= client_broken["event"],
        30,
        "the client skipping the queue's garbage",
    )
    wait_until(
        lambda: cache.pool.undecodable_replies >= client_broken["reply"],
        30,
        "the client skipping the reply topic's garbage",
    )

    writer.put_all({f"after{i}": i for i in range(10)})  # valid traffic after the garbage
    region.put("after-own", "x")
    assert region.get("after3") == 3

    wait_until(
        lambda: {f"after{i}" for i in range(10)} <= {k for _, k, _ in recorder.snapshot()},
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
        lambda: {f"after{i}" for i in range(10)} <= set(listener.keys),
        60,
        "the async event queue listener",
    )
    assert a.values().keys() >= expected_b.keys() | {"after-own"}

    for dead_ns, expected in expected_dead.items():

        def all_dead_lettered(ns: str = dead_ns, want: Counter[bytes | None] = expected) -> bool:
            got = Counter(v for v, h in _dead_letters(a.kafka, ns) if h.get("rb.reason"))
            return not (want - got)

        wait_until(all_dead_lettered, 60, f"every broken message in {dead_ns}.dead-letter")
        sources = {h["rb.source.topic"].decode() for _, h in _dead_letters(a.kafka, dead_ns)}
        assert sources <= set(server_topics), sources

    for name, worker in workers.items():
        assert worker.alive, f"{name} died: {worker.failure!r}"
    # The client's two reader threads are alive: the puts after the garbage got their
    # replies and their events.

    # The Spark decode helper turns every fuzzed value into rows, one at least per value.
    source_rows, _ = decode_record_values(every_value)
    assert set(source_rows) == set(range(len(every_value)))
