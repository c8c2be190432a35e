"""Helpers shared by the integration tests: a recording listener and waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from regionbus.broker.interest import InterestRegistry
from regionbus.schemas.callbacks import CacheListener, CacheWriter, EntryEvent, RegionEvent
from regionbus.schemas.errors import CacheWriterError
from regionbus.schemas.kafka_clients import kafka_producer


class Recorder(CacheListener):
    """Records every callback as ``(method, key_or_region, value)``; thread-safe."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.events: list[EntryEvent | RegionEvent] = []
        self._lock = threading.Lock()

    def _add(self, method: str, name: str, value: Any, event: EntryEvent | RegionEvent) -> None:
        with self._lock:
            self.calls.append((method, name, value))
            self.events.append(event)

    def after_create(self, event: EntryEvent) -> None:
        self._add("create", event.key, event.new_value, event)

    def after_update(self, event: EntryEvent) -> None:
        self._add("update", event.key, event.new_value, event)

    def after_invalidate(self, event: EntryEvent) -> None:
        self._add("invalidate", event.key, None, event)

    def after_destroy(self, event: EntryEvent) -> None:
        self._add("destroy", event.key, None, event)

    def after_region_clear(self, event: RegionEvent) -> None:
        self._add("region_clear", event.region, None, event)

    def after_region_destroy(self, event: RegionEvent) -> None:
        self._add("region_destroy", event.region, None, event)

    def after_region_live(self, event: RegionEvent) -> None:
        self._add("region_live", event.region, None, event)

    def snapshot(self) -> list[tuple[str, str, Any]]:
        with self._lock:
            return list(self.calls)

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()
            self.events.clear()


class Vetoing(CacheWriter):
    """A writer that aborts every change of the keys (or region op) it is told to."""

    def __init__(self, keys: set[str] | None = None, region_ops: bool = False) -> None:
        self.keys = keys or set()
        self.region_ops = region_ops
        self.calls: list[str] = []

    def _check(self, name: str, key: str) -> None:
        self.calls.append(f"{name}:{key}")
        if key in self.keys:
            raise CacheWriterError(f"vetoed {name} of {key}")

    def before_create(self, event: EntryEvent) -> None:
        self._check("before_create", event.key)

    def before_update(self, event: EntryEvent) -> None:
        self._check("before_update", event.key)

    def before_destroy(self, event: EntryEvent) -> None:
        self._check("before_destroy", event.key)

    def before_region_clear(self, event: RegionEvent) -> None:
        self.calls.append("before_region_clear")
        if self.region_ops:
            raise CacheWriterError("vetoed clear")

    def before_region_destroy(self, event: RegionEvent) -> None:
        self.calls.append("before_region_destroy")
        if self.region_ops:
            raise CacheWriterError("vetoed region destroy")


def wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0, what: str = "") -> None:
    """Poll ``predicate`` every 20 ms until true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or predicate}")


def settle(cache: Any, idle_s: float = 0.4) -> None:
    """Wait until a client's subscription queue has been quiet for ``idle_s`` seconds."""
    assert cache.wait_for_quiet(idle_s=idle_s, timeout_s=30), "subscription queue never went quiet"


def send_raw_operation(kafka_bootstrap_servers: str, namespace: str, op: Any, bucket: int) -> None:
    """Produce an operation to ``{ns}.ops`` directly, as a server-side application would."""

    from regionbus.schemas.codec import encode
    from regionbus.schemas.naming import Topics

    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(Topics(namespace).ops, encode(op), partition=bucket)
    assert producer.flush(10) == 0


def send_raw_batch(
    kafka_bootstrap_servers: str, namespace: str, ops: list[Any], bucket: int
) -> None:
    """Produce operations to ``{ns}.ops`` as one batch message (one poll on the server)."""

    from regionbus.schemas.codec import encode, encode_batches
    from regionbus.schemas.naming import Topics

    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    for value in encode_batches([encode(op) for op in ops]):
        producer.produce(Topics(namespace).ops, value, partition=bucket)
    assert producer.flush(10) == 0


class Sentinel:
    """Proves that "nothing else arrived": a change of a sentinel key, made after the action
    under test, reaches the client after anything the action caused (one server produces a
    client's events in apply order)."""

    def __init__(self, writer_region: Any, recorder: Recorder, key: str = "sentinel") -> None:
        self.region = writer_region
        self.recorder = recorder
        self.key = key
        self.count = 0

    def fence(self) -> list[tuple[str, str, Any]]:
        """Put the sentinel, wait for it, and return the calls recorded before it."""
        self.count += 1
        marker = f"fence-{self.count}"
        self.region.put(self.key, marker)
        wait_until(
            lambda: any(c[1] == self.key and c[2] == marker for c in self.recorder.snapshot()),
            what=f"sentinel {marker}",
        )
        calls = self.recorder.snapshot()
        index = next(i for i, c in enumerate(calls) if c[1] == self.key and c[2] == marker)
        before = [c for c in calls[:index] if c[1] != self.key]
        self.recorder.clear()
        return before


def entry_operation(
    member: str, kind: Any, key: str, sequence: int, value: bytes | None = None, request_id: int = 1
) -> Any:
    """An entry operation on region ``r`` from another member (a server-side application),
    with its EventID in the key's bucket (16 buckets). Returns ``(operation, bucket)``."""
    from regionbus.schemas.eventid import EventID
    from regionbus.schemas.messages import Operation
    from regionbus.schemas.naming import bucket_of

    bucket = bucket_of("r", key, 16)
    op = Operation(
        request_id=request_id,
        client_id=member,
        kind=kind,
        region="r",
        timestamp_ms=int(time.time() * 1000),
        event_id=EventID(member, 1, sequence, bucket),
        key=key,
        value=value,
        serializer="json" if value is not None else None,
    )
    return op, bucket


@contextmanager
def bystander_puts(region: Any, keys: list[str], at_least: int = 5) -> Iterator[list[float]]:
    """Put to ``keys`` of ``region`` in turn, on another thread, while the block runs (and
    ``at_least`` times in all); yields the list their latencies go to, in seconds: what
    another client sees while the block makes a server work."""
    latencies: list[float] = []
    done = threading.Event()

    def run() -> None:
        i = 0
        while not done.is_set() or i < at_least:
            started = time.monotonic()
            region.put(keys[i % len(keys)], i)
            latencies.append(time.monotonic() - started)
            i += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        done.set()
        thread.join(120)


def consumer_groups(kafka_bootstrap_servers: str) -> set[str]:
    """Every consumer group Kafka holds now."""
    from regionbus.schemas.kafka_clients import kafka_admin

    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})  # kept until answered
    listed = admin.list_consumer_groups(request_timeout=10).result(timeout=15)
    return {g.group_id for g in listed.valid}


def dead_letters(kafka: str, namespace: str) -> list[tuple[bytes | None, dict[str, bytes]]]:
    """Every record of ``{ns}.dead-letter`` so far, with its headers."""
    from confluent_kafka import TopicPartition

    from regionbus.schemas.kafka_clients import kafka_consumer

    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"dead-letter-check-{time.monotonic_ns()}",
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


def routed(registry: InterestRegistry, region: str, key: str, bucket: int) -> dict[str, bool]:
    """``{client id: receive_values}`` a change of ``key`` in ``bucket`` is routed to, by
    the server's interest registry (its audiences and the clients routed alone)."""
    route = registry.table.audiences(region, key, bucket)
    out = dict(route.individual)
    for audience in route.audiences:
        for client_id in audience.clients:
            out[client_id] = audience.receive_values
    return out


def writer_and_subscriber(client_factory: Any) -> tuple[Any, Any, Recorder]:
    """A writer region and a subscriber region (ALL_KEYS, values) of two clients on region
    ``r``, and the subscriber's recorder."""
    from regionbus.clients import ALL_KEYS

    writer = client_factory().create_region("r")
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(ALL_KEYS)
    return writer, reader, recorder
