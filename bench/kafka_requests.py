"""Kafka requests per lone put, per process, beside raw Kafka's two-hop relay.

``python -m bench.kafka_requests`` runs, in this process, a cache server, a writer and one
subscriber (``ALL_KEYS``) on the local stack (or ``REGIONBUS_KAFKA_BOOTSTRAP_SERVERS`` /
``REGIONBUS_REDIS_URL``), then a raw relay of the same shape (a producer, a topic, a
consume-and-produce loop, a topic, a consumer), and counts the requests each sends while
``--puts`` puts go one at a time, each after the last one's event arrived. The counts are
librdkafka's own (``statistics.interval.ms``: the per-broker ``req`` counters of every
client), less those of an idle window of the same length (the long-poll fetches a consumer
sends while nothing arrives, every ``--fetch-wait-ms``). librdkafka sends one
ProduceRequest per topic partition (librdkafka issue #1700), so a server's event, queue
record and reply are three.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import click
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from rich.console import Console
from rich.table import Table

import regionbus.schemas.kafka_clients as kafka_clients
from bench.summary import SummaryRow, emit
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, CacheListener, ClientCache, ClientSettings, EntryEvent
from regionbus.devstack import LocalStack
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer

STATISTICS_INTERVAL_MS = 100
KINDS = ("Produce", "Fetch")


@dataclass
class _Handle:
    client_id: str
    kind: str
    requests: dict[str, int]
    at_s: float


class RequestCounts:
    """The latest statistics of every librdkafka client made in this process after
    :meth:`install` (all threads of the process share it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.handles: dict[str, _Handle] = {}

    def config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` reporting statistics here (and still to its own ``stats_cb``)."""
        chained = config.get("stats_cb")

        def on_stats(statistics_json: str) -> None:
            stats = json.loads(statistics_json)
            requests: dict[str, int] = {}
            for broker in stats["brokers"].values():
                for kind, count in broker.get("req", {}).items():
                    requests[kind] = requests.get(kind, 0) + count
            with self._lock:
                self.handles[stats["name"]] = _Handle(
                    stats["client_id"], stats["type"], requests, time.monotonic()
                )
            if chained is not None:
                chained(statistics_json)

        return {**config, "statistics.interval.ms": STATISTICS_INTERVAL_MS, "stats_cb": on_stats}

    def install(self) -> Callable[[], None]:
        """Have every Kafka client made from now on report here; returns the undo."""
        factory_config = kafka_clients.factory_config
        kafka_clients.factory_config = lambda config: self.config(factory_config(config))

        def undo() -> None:
            kafka_clients.factory_config = factory_config

        return undo

    def snapshot(
        self, client_ids: set[str], kind: str, types: tuple[str, ...] = ("producer",)
    ) -> dict[str, int]:
        """``{client id: requests of kind}`` of the clients of these ids and types, from
        statistics each live client reported after this call began (waits up to 30 s).

        Raises:
            TimeoutError: a client reported no statistics in 30 s (it is not polled).
        """
        asked = time.monotonic()
        deadline = asked + 30

        def mine() -> list[_Handle]:
            with self._lock:
                return [
                    h
                    for h in self.handles.values()
                    if h.client_id in client_ids and h.kind in types
                ]

        # A client closed (a connect's own producer) reports no more: wait only for those
        # that reported in the last second.
        while not (mine() and all(h.at_s > asked for h in mine() if h.at_s > asked - 1.0)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fresh statistics of {sorted(client_ids)}")
            time.sleep(0.02)
        counts: dict[str, int] = {}
        for handle in mine():
            counts[handle.client_id] = counts.get(handle.client_id, 0) + handle.requests.get(
                kind, 0
            )
        return counts


class _Arrivals(CacheListener):
    def __init__(self) -> None:
        self.count = 0

    def after_create(self, event: EntryEvent) -> None:
        self.count += 1

    def after_update(self, event: EntryEvent) -> None:
        self.count += 1


def _wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.001)


def _more(count: Callable[[], int], than: int) -> bool:
    return count() > than


def _spent(
    counts: RequestCounts, ids: dict[str, set[str]], window: Callable[[], None]
) -> dict[tuple[str, str], int]:
    """``{(process, kind): requests}`` the processes' clients sent during ``window``."""
    types = ("producer", "consumer")
    every = set().union(*ids.values())
    before = {kind: counts.snapshot(every, kind, types) for kind in KINDS}
    window()
    after = {kind: counts.snapshot(every, kind, types) for kind in KINDS}
    return {
        (process, kind): sum(after[kind].get(i, 0) - before[kind].get(i, 0) for i in members)
        for process, members in ids.items()
        for kind in KINDS
    }


def regionbus_requests(
    counts: RequestCounts, kafka: str, redis_url: str, puts: int, fetch_wait_ms: int
) -> dict[tuple[str, str], float]:
    """Requests per lone put by process (``writer``, ``server``, ``subscriber``) and kind."""
    namespace = f"req{secrets.token_hex(3)}"
    server = CacheServer(
        ServerSettings(
            namespace=namespace,
            kafka_bootstrap_servers=kafka,
            redis_url=redis_url,
            regions=["r"],
            fetch_wait_max_ms=fetch_wait_ms,
        )
    )
    server.start()
    made: dict[str, Any] = {"fetch_wait_max_ms": fetch_wait_ms, "linger_ms": 0}
    writer_cache = ClientCache(
        ClientSettings(
            namespace=namespace, kafka_bootstrap_servers=kafka, subscription_enabled=False, **made
        )
    )
    reader_cache = ClientCache(
        ClientSettings(namespace=namespace, kafka_bootstrap_servers=kafka, **made)
    )
    try:
        arrivals = _Arrivals()
        writer = writer_cache.create_region("r")
        reader = reader_cache.create_region("r", listeners=[arrivals])
        reader.register_interest(ALL_KEYS)
        writer.put("warm", 0)
        _wait(lambda: arrivals.count == 1, "the warm-up event")
        member = server.settings.member_id
        ids = {
            "writer": {writer_cache.client_id, writer_cache.member_id},
            "server": {member, f"{member}.events"},
            "subscriber": {reader_cache.client_id, reader_cache.member_id},
        }

        def lone_puts() -> None:
            for i in range(puts):
                seen = arrivals.count
                writer.put(f"k{i}", i)
                _wait(partial(_more, lambda: arrivals.count, seen), "an event")

        started = time.monotonic()
        busy = _spent(counts, ids, lone_puts)
        length_s = time.monotonic() - started
        idle = _spent(counts, ids, lambda: time.sleep(length_s))
    finally:
        reader_cache.close()
        writer_cache.close()
        server.stop()
    return {key: (busy[key] - idle[key]) / puts for key in busy}


def relay_requests(
    counts: RequestCounts, kafka: str, messages: int, fetch_wait_ms: int
) -> dict[tuple[str, str], float]:
    """Requests per message of raw Kafka's two-hop relay, by process (``writer``,
    ``relay``, ``subscriber``) and kind."""
    tag = secrets.token_hex(3)
    topic_in, topic_out = f"req{tag}.in", f"req{tag}.out"
    admin = kafka_admin({"bootstrap.servers": kafka})
    for future in admin.create_topics([NewTopic(t, 16, 1) for t in (topic_in, topic_out)]).values():
        future.result(30)
    base = {"bootstrap.servers": kafka, "fetch.wait.max.ms": fetch_wait_ms}
    producer = kafka_producer({"bootstrap.servers": kafka, "client.id": f"w{tag}"})
    relay_in = kafka_consumer({**base, "group.id": f"r{tag}", "client.id": f"r{tag}"})
    relay_out = kafka_producer({"bootstrap.servers": kafka, "client.id": f"r{tag}"})
    sink = kafka_consumer({**base, "group.id": f"s{tag}", "client.id": f"s{tag}"})
    relay_in.assign([TopicPartition(topic_in, p, 0) for p in range(16)])
    sink.assign([TopicPartition(topic_out, p, 0) for p in range(16)])
    stop = threading.Event()
    received = [0]

    def relay() -> None:
        while not stop.is_set():
            message = relay_in.poll(0.05)
            relay_out.poll(0)
            if message is not None and not message.error():
                partition = message.partition()
                relay_out.produce(topic_out, message.value(), partition=partition or 0)

    def consume() -> None:
        while not stop.is_set():
            message = sink.poll(0.05)
            producer.poll(0)
            if message is not None and not message.error():
                received[0] += 1

    threads = [threading.Thread(target=relay), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    try:
        producer.produce(topic_in, b"warm", partition=0)
        _wait(lambda: received[0] == 1, "the warm-up message")
        ids = {"writer": {f"w{tag}"}, "relay": {f"r{tag}"}, "subscriber": {f"s{tag}"}}

        def lone_messages() -> None:
            for i in range(messages):
                seen = received[0]
                producer.produce(topic_in, b"x", partition=i % 16)
                _wait(partial(_more, lambda: received[0], seen), "a message")

        started = time.monotonic()
        busy = _spent(counts, ids, lone_messages)
        idle = _spent(counts, ids, lambda: time.sleep(time.monotonic() - started))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        relay_in.close()
        sink.close()
    return {key: (busy[key] - idle[key]) / messages for key in busy}


def _table(
    ours: dict[tuple[str, str], float], relay: dict[tuple[str, str], float], console: Console
) -> None:
    table = Table(title="Kafka requests per lone put, per process (librdkafka's statistics)")
    for column in ("process", "request", "regionbus", "two-hop relay"):
        table.add_column(column, justify="left" if column in ("process", "request") else "right")
    for process in ("writer", "server", "relay", "subscriber"):
        for kind in KINDS:
            a, b = ours.get((process, kind)), relay.get((process, kind))
            if a is not None or b is not None:
                table.add_row(
                    process,
                    kind,
                    "-" if a is None else f"{a:.2f}",
                    "-" if b is None else f"{b:.2f}",
                )
    table.add_row("total", "", f"{sum(ours.values()):.2f}", f"{sum(relay.values()):.2f}")
    console.print(table)


@click.command()
@click.option("--puts", default=100, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--fetch-wait-ms",
    default=5_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="fetch.wait.max.ms of every consumer: long, so few idle fetches are subtracted.",
)
def main(puts: int, fetch_wait_ms: int) -> None:
    """Count the Kafka requests of lone puts, per process, beside raw Kafka's relay."""
    console = Console()
    counts = RequestCounts()
    undo = counts.install()
    try:
        with LocalStack() as stack:
            kafka, redis_url = stack.kafka_bootstrap_servers, stack.redis_url
            ours = regionbus_requests(counts, kafka, redis_url, puts, fetch_wait_ms)
            relay = relay_requests(counts, kafka, puts, fetch_wait_ms)
    finally:
        undo()
    _table(ours, relay, console)
    emit(
        [
            SummaryRow(
                "kafka_requests",
                "Kafka requests per lone put (every process)",
                sum(ours.values()),
                sum(relay.values()),
                "two-hop relay requests per message",
                higher_is_better=False,
            )
        ]
    )


if __name__ == "__main__":
    main()
