"""A hostile or careless client cannot stop a cache server (invariant 6).

- A poison-pill interest regex (500 nested groups: Python's ``re`` raised ``RecursionError``
  compiling it) produced straight to ``{ns}.ops`` is dead-lettered with its reason; the
  server goes on and other clients' puts are answered.
- Any unexpected exception while one operation is handled (here a ``RecursionError``
  injected into the PUT handler) dead-letters that operation, replies an error to its
  sender, and the server goes on.
- A catastrophic-backtracking regex (``(a+)+$``) with a key of ``a``s that fails to match
  does not stall the server: another client's put on another region answers in its normal
  time. With Python's ``re`` the server's one thread (and the GIL) stalled for seconds.
- A compression bomb, a batch of 990,000 empty items and an undecodable record as large as
  a topic takes are each dead-lettered once, as one record, and their bucket serves again;
  another client's puts are not held up meanwhile.

The tests only use names that exist before the fix, so they can be run against the old code.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from fastavro import schemaless_writer
from support import bystander_puts, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.schemas.codec import BATCH_TYPE, MAGIC, encode, load_avro_schema
from regionbus.schemas.errors import InvalidInterestError, ServerOperationError
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.messages import InterestKind, InterestSpec, Operation, OperationKind
from regionbus.schemas.naming import Topics, bucket_of
from regionbus.schemas.transport import watermarks

pytestmark = pytest.mark.abuse

POISON_REGEX = "(" * 500 + "a" + ")" * 500
BACKTRACKING_REGEX = "(a+)+$"
BACKTRACKING_KEY = "a" * 28 + "!"
"""29 characters: with Python's ``re``, ``(a+)+$`` tries about 2**28 ways to fail on it
(about 15 s here)."""

NORMAL_PUT_BOUND_S = 3.0
"""Longest a put on an idle server may take while another region's event is routed
(a put takes a few ms; the bound leaves room for a loaded machine)."""


@pytest.fixture
def two_region_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    server = CacheServer(server_settings.model_copy(update={"regions": ["r", "s"]}))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _dead_letter_reasons(kafka: str, namespace: str, at_least: int) -> list[str]:
    """The ``rb.reason`` of the first ``at_least`` records of ``{ns}.dead-letter``."""
    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"hostile-check-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(f"{namespace}.dead-letter", 0, 0)])
    reasons: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while len(reasons) < at_least and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            headers = dict(message.headers() or [])
            reason = headers.get("rb.reason") or b""
            reasons.append(reason.decode() if isinstance(reason, bytes) else str(reason))
    finally:
        consumer.close()
    return reasons


def _timed_put(cache: object, region: str, key: str) -> float:
    started = time.monotonic()
    cache.get_region(region).put(key, 1)  # type: ignore[attr-defined]
    return time.monotonic() - started


def test_poison_pill_regex_on_ops_is_dead_lettered_and_the_server_goes_on(
    two_region_server: CacheServer,
    client_factory,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    bystander = client_factory()
    bystander.create_region("s")
    bystander.get_region("s").put("before", 1)

    poison = Operation(
        request_id=1,
        client_id="intruder",
        kind=OperationKind.REGISTER_INTEREST,
        region="r",
        timestamp_ms=int(time.time() * 1000),
        interest=InterestSpec(InterestKind.REGEX, (), POISON_REGEX),
    )
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(Topics(namespace).ops, encode(poison), partition=3)
    producer.flush(10)

    reasons = _dead_letter_reasons(kafka_bootstrap_servers, namespace, at_least=1)
    assert reasons, "the poison-pill registration was not dead-lettered"
    assert "interest regex" in reasons[0]
    assert two_region_server.alive, f"server died: {two_region_server.failure}"
    assert _timed_put(bystander, "s", "after") < NORMAL_PUT_BOUND_S
    assert bystander.get_region("s").get("after") == 1


def test_client_refuses_the_poison_pill_regex_before_sending(
    two_region_server: CacheServer, client_factory
) -> None:
    cache = client_factory()
    region = cache.create_region("r")
    with pytest.raises(InvalidInterestError, match="interest regex"):
        region.register_interest_regex(POISON_REGEX)
    assert region.interest == []


def test_unexpected_error_in_a_handler_dead_letters_the_operation_and_the_server_goes_on(
    two_region_server: CacheServer,
    client_factory,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    # A bug that one rare input reaches, injected into the PUT handler: the kind of error
    # (RecursionError) the poison-pill regex raised before regexes ran on RE2.
    parts = two_region_server._parts
    assert parts is not None
    put_handler = parts.handlers.table[OperationKind.PUT]

    def buggy_put(op: Operation, bucket: int, offset: int) -> None:
        if op.key == "boom":
            raise RecursionError("maximum recursion depth exceeded")
        put_handler(op, bucket, offset)

    parts.handlers.table[OperationKind.PUT] = buggy_put
    cache = client_factory()
    region = cache.create_region("r")
    other = cache.create_region("s")
    region.put("fine", 1)
    with pytest.raises(ServerOperationError, match="RecursionError"):
        region.put("boom", 1)
    reasons = _dead_letter_reasons(kafka_bootstrap_servers, namespace, at_least=1)
    assert any("RecursionError" in reason for reason in reasons), reasons
    assert two_region_server.alive, f"server died: {two_region_server.failure}"
    assert two_region_server.stats.dead_letters_by_category.get("processing_failed") == 1
    region.put("fine-again", 2)
    assert _timed_put(cache, "s", "other") < NORMAL_PUT_BOUND_S
    assert other.get("other") == 1
    assert region.get("boom") is None


def test_backtracking_regex_does_not_stall_other_clients(
    two_region_server: CacheServer, client_factory
) -> None:
    subscriber = client_factory()
    watched = subscriber.create_region("r")
    watched.register_interest_regex(BACKTRACKING_REGEX)

    bystander = client_factory()
    bystander.create_region("s")
    baseline_s = min(_timed_put(bystander, "s", f"warm-{i}") for i in range(3))

    writer = client_factory()
    writer.create_region("r").put_async(BACKTRACKING_KEY, 1)
    writer.get_region("r").put_async("a" * 40, 2)
    # The events of the hostile keys are routed now; a stalled server answers nothing.
    latencies = [_timed_put(bystander, "s", f"during-{i}") for i in range(5)]
    print(
        f"bystander put: baseline {baseline_s * 1000:.1f} ms, worst while routing "
        f"the hostile keys {max(latencies) * 1000:.1f} ms"
    )
    bound_s = max(NORMAL_PUT_BOUND_S, 10 * baseline_s)
    assert max(latencies) < bound_s, f"puts took {latencies} s (baseline {baseline_s:.3f} s)"
    wait_until(lambda: watched.contains_key("a" * 40), what="the matching key's event")
    assert not watched.contains_key(BACKTRACKING_KEY)
    assert two_region_server.alive


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda r: r.put("k" * 1_000_000, 1), "InvalidKeyError"),
        (lambda r: r.put("\ud800", 1), "InvalidKeyError"),
        (lambda r: r.put(42, 1), "InvalidKeyError"),
        (lambda r: r.get(None), "InvalidKeyError"),
        (lambda r: r.destroy(7), "InvalidKeyError"),
        (lambda r: r.put("k", "v" * 1_000_000), "ValueTooLargeError"),
    ],
)
def test_bad_arguments_raise_typed_errors_before_anything_is_sent(
    cache_server: CacheServer, client_factory, call, error: str
) -> None:
    from regionbus.schemas.errors import RegionBusError

    region = client_factory().create_region("r")
    region.put("before", 1)
    applied = cache_server.stats.operations_applied
    with pytest.raises(RegionBusError) as raised:
        call(region)
    assert type(raised.value).__name__ == error
    region.put("after", 1)
    assert cache_server.stats.operations_applied == applied + 1


@pytest.mark.parametrize("name", ["", "a b", "*", "r" * 5_000])
def test_bad_region_names_are_refused_by_the_client(
    cache_server: CacheServer, client_factory, name: str
) -> None:
    from regionbus.schemas.errors import RegionBusError

    cache = client_factory()
    with pytest.raises(RegionBusError) as raised:
        cache.create_region(name)
    assert type(raised.value).__name__ == "InvalidRegionNameError"
    assert cache.get_region(name) is None


# --- records Kafka's client cannot read, and batches no legal client sends ----------------

BYSTANDER_BOUND_S = 1.0
"""Longest another client's put may take while a server deals with a hostile record (on a
loaded machine the bound grows to ten times the put's own baseline)."""


def _key_in(region: str, bucket: int, total_buckets: int = 16) -> str:
    return next(
        key
        for key in (f"k{i}" for i in range(10_000))
        if bucket_of(region, key, total_buckets) == bucket
    )


def _produce(config: dict[str, Any], topic: str, partition: int, values: list[bytes]) -> list[int]:
    """Produce ``values`` to one partition with ``config`` (a producer of its own); their
    offsets."""
    offsets: list[int] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        offsets.append(message.offset())

    producer = kafka_producer(config)
    for value in values:
        producer.produce(topic, value, partition=partition, on_delivery=delivered)
    assert producer.flush(60) == 0
    return sorted(offsets)


def _bomb_config(kafka: str) -> dict[str, Any]:
    """An attacker's producer: zstd, records of any size (Kafka checks the compressed
    batch), all in one batch."""
    return {
        "bootstrap.servers": kafka,
        "compression.type": "zstd",
        "message.max.bytes": 1_000_000_000,
        "batch.size": 1_000_000_000,
        "linger.ms": 200,
    }


def _dead_letters_of(kafka: str, namespace: str) -> list[tuple[dict[str, str], int]]:
    """Headers (as text) and value length of every record of ``{ns}.dead-letter``, read to
    the high watermark asked first."""
    topic = f"{namespace}.dead-letter"
    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"hostile-check-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    out: list[tuple[dict[str, str], int]] = []
    try:
        _, high = watermarks(consumer, TopicPartition(topic, 0), 10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(out) < high and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                if message.error() is not None:
                    continue
                headers = {
                    str(name): (raw.decode() if isinstance(raw, bytes) else str(raw))
                    for name, raw in message.headers() or []
                }
                out.append((headers, len(message.value() or b"")))
    finally:
        consumer.close()
    return out


def _dead_letter_count(kafka: str, namespace: str) -> int:
    consumer = kafka_consumer({"bootstrap.servers": kafka, "group.id": "hostile-count"})
    try:
        low, high = watermarks(consumer, TopicPartition(f"{namespace}.dead-letter", 0), 10)
    finally:
        consumer.close()
    return high - low


def _from(dead: list[tuple[dict[str, str], int]], topic: str, offset: int) -> list[dict[str, str]]:
    return [
        headers
        for headers, _ in dead
        if headers.get("rb.source.topic") == topic
        and headers.get("rb.source.offset") == str(offset)
    ]


def test_a_compression_bomb_on_ops_is_dead_lettered_once_and_its_bucket_serves_again(
    server_settings: ServerSettings,
    client_factory,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    """One zstd record of 200 MB zeros (about 6 KB on the wire): librdkafka cannot
    decompress it within ``receive.message.max.bytes`` and reported ``_BAD_COMPRESSION`` at
    the same offset forever, so the bucket answered nothing, even after a restart."""
    settings = server_settings.model_copy(update={"regions": ["r", "s"]})
    ops = Topics(namespace).ops
    bucket = 5
    server = CacheServer(settings)
    server.start()
    try:
        victim = client_factory(read_timeout_ms=20_000).create_region("r")
        key = _key_in("r", bucket)
        victim.put(key, 0)
        bystander = client_factory().create_region("s")
        other = [_key_in("s", b) for b in range(16) if b != bucket][:5]
        baseline_s = min(_timed_region_put(bystander, other[0], i) for i in range(3))

        [bomb] = _produce(_bomb_config(kafka_bootstrap_servers), ops, bucket, [b"\0" * 200_000_000])
        started = time.monotonic()
        with bystander_puts(bystander, other) as latencies:
            victim.put(key, 1)  # behind the bomb in its bucket
            serving_again_s = time.monotonic() - started
        print(
            f"compression bomb at {ops}[{bucket}]@{bomb}: the bucket served again after "
            f"{serving_again_s:.2f} s; another bucket's puts meanwhile: baseline "
            f"{baseline_s * 1000:.0f} ms, worst {max(latencies) * 1000:.0f} ms"
        )
        assert max(latencies) <= max(BYSTANDER_BOUND_S, 10 * baseline_s), latencies
        wait_until(
            lambda: _from(_dead_letters_of(kafka_bootstrap_servers, namespace), ops, bomb),
            what="the bomb's dead letter",
        )
        assert server.alive and server.stats.dead_letters_by_category == {"unreadable": 1}
    finally:
        server.stop()

    [reason] = [
        h["rb.reason"]
        for h in _from(_dead_letters_of(kafka_bootstrap_servers, namespace), ops, bomb)
    ]
    assert "_BAD_COMPRESSION" in reason and f"offsets {bomb}-{bomb}" in reason

    # A restart reads from the committed offsets: past the bomb, nothing dead-lettered again.
    again = CacheServer(settings)
    again.start()
    try:
        victim.put(key, 2)
        assert victim.get(key) == 2
        assert again.stats.dead_letters == 0
    finally:
        again.stop()
    assert _dead_letter_count(kafka_bootstrap_servers, namespace) == 1


def _timed_region_put(region: Any, key: str, value: int) -> float:
    started = time.monotonic()
    region.put(key, value)
    return time.monotonic() - started


def _avro_batch(items: list[bytes]) -> bytes:
    """A Batch frame of ``items`` written with the batch schema itself (no item limit)."""
    buf = io.BytesIO()
    buf.write(bytes((MAGIC, BATCH_TYPE)))
    schemaless_writer(buf, load_avro_schema("Batch"), {"messages": items})
    return buf.getvalue()


def test_a_batch_of_990000_empty_items_is_dead_lettered_whole_and_stalls_no_other_client(
    two_region_server: CacheServer,
    client_factory,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    """A 1 MB Avro ``Batch`` of 990,000 empty items on ``{ns}.ops`` made 990,000 dead
    letters and held the server's loop for about 55 s; no legal client sends more than
    ``MAX_BATCH_ITEMS`` items in one batch, so it is one bad record."""
    ops = Topics(namespace).ops
    bystander = client_factory().create_region("s")
    baseline_s = min(_timed_region_put(bystander, "warm", i) for i in range(3))
    huge = _avro_batch([b""] * 990_000)
    [offset] = _produce({"bootstrap.servers": kafka_bootstrap_servers}, ops, 7, [huge])
    started = time.monotonic()
    with bystander_puts(bystander, [f"during{i}" for i in range(4)], at_least=10) as latencies:
        wait_until(
            lambda: _from(_dead_letters_of(kafka_bootstrap_servers, namespace), ops, offset),
            what="the batch's dead letter",
        )
        handled_s = time.monotonic() - started
    dead = _dead_letter_count(kafka_bootstrap_servers, namespace)
    print(
        f"batch of 990,000 empty items ({len(huge):,} bytes): {dead:,} dead letters, "
        f"seen dead-lettered after {handled_s:.2f} s; another client's puts: baseline "
        f"{baseline_s * 1000:.0f} ms, worst {max(latencies) * 1000:.0f} ms"
    )
    assert dead == 1
    [headers] = _from(_dead_letters_of(kafka_bootstrap_servers, namespace), ops, offset)
    assert "more than 4096 items" in headers["rb.reason"]  # codec.MAX_BATCH_ITEMS
    assert max(latencies) <= max(BYSTANDER_BOUND_S, 10 * baseline_s), latencies
    assert two_region_server.alive


def _narrow(kafka_bootstrap_servers: str, topic: str, max_message_bytes: int) -> None:
    """Lower a topic's ``max.message.bytes`` and wait until the broker reports it."""
    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    resource.add_incremental_config(
        ConfigEntry(
            "max.message.bytes", str(max_message_bytes), incremental_operation=AlterConfigOpType.SET
        )
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=10)

    def narrowed() -> bool:
        (described,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        return described.result(timeout=10)["max.message.bytes"].value == str(max_message_bytes)

    wait_until(narrowed, what=f"{topic} narrowed")


@pytest.mark.parametrize("dead_letter_topic", ["as made", "narrowed while serving"])
def test_a_record_at_the_topics_size_limit_is_dead_lettered_once(
    server_settings: ServerSettings,
    client_factory,
    namespace: str,
    kafka_bootstrap_servers: str,
    dead_letter_topic: str,
) -> None:
    """An undecodable record as large as ``{ns}.ops`` takes: its dead letter (the record
    plus headers) was over the server producer's ``message.max.bytes``, the failed delivery
    made the server rewind and read it again, for ever. A dead-letter topic whose limit
    leaves no room for the headers (an operator lowered it while the server runs: at
    start the server sets it back) refuses it too: it is then sent without its value."""
    topics = Topics(namespace)
    server = CacheServer(server_settings.model_copy(update={"regions": ["r", "s"]}))
    server.start()
    if dead_letter_topic != "as made":
        _narrow(kafka_bootstrap_servers, topics.dead_letter, 1_048_588)
    try:
        bucket = 9
        region = client_factory(read_timeout_ms=20_000).create_region("r")
        key = _key_in("r", bucket)
        # Kafka's default max.message.bytes (record_limits.RECORD_BATCH_MAX_BYTES) less the
        # record batch's framing: its dead letter's headers take it over.
        value = b"\xb1\x01" + b"x" * (1_048_588 - 200)
        [offset] = _produce(
            {"bootstrap.servers": kafka_bootstrap_servers, "message.max.bytes": 2_000_000},
            topics.ops,
            bucket,
            [value],
        )
        region.put(key, 1)  # behind it in its bucket
        wait_until(
            lambda: _from(_dead_letters_of(kafka_bootstrap_servers, namespace), topics.ops, offset),
            what="the record's dead letter",
        )
        assert server.alive and region.get(key) == 1
    finally:
        server.stop()
    dead = [
        (headers, length)
        for headers, length in _dead_letters_of(kafka_bootstrap_servers, namespace)
        if headers.get("rb.source.offset") == str(offset)
    ]
    if dead_letter_topic == "as made":
        assert [length for _, length in dead] == [len(value)]
    else:
        assert [(h.get("rb.value-dropped"), length) for h, length in dead] == [(str(len(value)), 0)]
