"""Storms of clients, for the storm test (``tests/integration/test_storms_are_paced.py``,
at a size that fits CI) and ``bench.fleet``'s storms phase (at full size).

- :func:`run_storm_clients`: a child process of clients that connect, wait for the word,
  then all register ``ALL_KEYS`` interest with ``KEYS_VALUES`` in one region at once;
  each client in a thread of its own, as many applications starting together would.
- :class:`ConnectStorm`: ``count`` CONNECT requests produced at once onto the control
  topic, as raw records (a ``ClientCache`` per connect would measure the client's start,
  not the servers' admission), and the time each answer took.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import TopicPartition

from bench.workers import child_signals
from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings, Region
from regionbus.schemas.codec import decode_items, encode
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.messages import Control, ControlKind, Reply
from regionbus.schemas.naming import Topics
from regionbus.schemas.transport import watermarks

CONNECTING_THREADS = 8
"""Threads a storm child connects its clients with (connecting is not the storm)."""
FIRST_STORM_REQUEST_ID = 1_000_000
"""The request ids of a connect storm start here, above any other client's."""


def fill_region(region: Region, entries: int, value: str = "v" * 64) -> None:
    """Put ``entries`` entries ``k0``, ``k1``, ... of ``value`` in ``region``, 1,000 a call."""
    for start in range(0, entries, 1000):
        region.put_all({f"k{i}": value for i in range(start, min(entries, start + 1000))})


def run_storm_clients(
    conn: Connection,
    *,
    settings: dict[str, Any],
    region: str,
    count: int,
    prefix: str,
    nice_increment: int = 0,
) -> None:
    """Child: ``count`` client caches (ids ``{prefix}-{n}``) connect and make ``region``;
    ``ready``; on ``expect`` every client registers ``ALL_KEYS`` at once. Result:
    ``entries`` (each client's local entry count), ``seconds`` (each registration's time)
    and ``errors`` (the ``repr`` of each failure).

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields (``client_id`` is set here).
        region: The region registered in.
        count: Clients in this process.
        prefix: Their client ids' prefix (distinct per child).
        nice_increment: Added to this process's nice value (``os.nice``), so that, on a
            machine the storm shares with the servers, its clients decoding their initial
            results take only the CPU the servers and the bystander leave, as clients on
            machines of their own would.
    """
    child_signals()
    if nice_increment:
        os.nice(nice_increment)

    def connect(n: int) -> ClientCache:
        return ClientCache(ClientSettings(**{**settings, "client_id": f"{prefix}-{n}"}))

    with ThreadPoolExecutor(CONNECTING_THREADS) as pool:
        caches = list(pool.map(connect, range(count)))
    try:
        regions = [cache.create_region(region) for cache in caches]
        conn.send(("ready", None))
        conn.recv()  # the word: ("expect", _)
        seconds: list[float] = []
        errors: list[str] = []

        def register(target: Region) -> None:
            began = time.monotonic()
            try:
                target.register_interest(ALL_KEYS)
            except Exception as exc:  # reported to the parent, which fails on it
                errors.append(repr(exc))
                return
            seconds.append(time.monotonic() - began)

        threads = [threading.Thread(target=register, args=(r,)) for r in regions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        entries = [len(r) for r in regions]
        conn.send(("result", {"entries": entries, "seconds": seconds, "errors": errors}))
    finally:
        for cache in caches:
            with suppress(Exception):
                cache.close()


@dataclass
class ConnectAnswers:
    """What a connect storm's answers were.

    Attributes:
        seconds: Per request id, the seconds from the storm's flush to its answer's arrival.
        produced_ms: Per request id, its answer's Kafka timestamp (ms since the epoch).
    """

    seconds: dict[int, float] = field(default_factory=dict)
    produced_ms: dict[int, int] = field(default_factory=dict)

    def answered_before(self, epoch_ms: float) -> int:
        """How many answers Kafka stamped at or before ``epoch_ms``."""
        return sum(1 for ms in self.produced_ms.values() if ms <= epoch_ms)


class ConnectStorm:
    """``count`` raw CONNECT requests of distinct clients, produced at once.

    Reads the shared reply topic from its end as of construction, so that answers to
    earlier requests are not counted.

    Args:
        bootstrap_servers: Kafka's bootstrap servers.
        namespace: The servers' namespace.
        count: Connects in the storm.
        prefix: Their client ids' prefix.
    """

    def __init__(self, bootstrap_servers: str, namespace: str, count: int, prefix: str) -> None:
        self._topics = Topics(namespace)
        self.count = count
        self._controls = [
            Control(
                ControlKind.CONNECT,
                f"{prefix}-{n}",
                int(time.time() * 1000),
                request_id=FIRST_STORM_REQUEST_ID + n,
                connection_id=f"{prefix}-{n}-c",
            )
            for n in range(count)
        ]
        replies = self._topics.client_replies(None)
        self._consumer = kafka_consumer(
            {"bootstrap.servers": bootstrap_servers, "group.id": f"{namespace}.{prefix}-replies"}
        )
        assigned = []
        for partition in self._consumer.list_topics(replies, timeout=10).topics[replies].partitions:
            position = TopicPartition(replies, partition)
            position.offset = watermarks(self._consumer, position, 10)[1]
            assigned.append(position)
        self._consumer.assign(assigned)
        self._producer = kafka_producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5})
        self._sent_s = 0.0

    def send(self) -> None:
        """Produce every CONNECT and wait until Kafka has them all.

        Raises:
            AssertionError: Kafka did not take them within 30 s.
        """
        for control in self._controls:
            self._producer.produce(self._topics.control, encode(control), key=control.client_id)
        assert self._producer.flush(30) == 0, "the connect storm was not produced"
        self._sent_s = time.monotonic()

    def answers(self, timeout_s: float) -> ConnectAnswers:
        """Read answers until every connect has one or ``timeout_s`` passed; closes the
        reader."""
        got = ConnectAnswers()
        deadline_s = self._sent_s + timeout_s
        try:
            while len(got.seconds) < self.count and time.monotonic() < deadline_s:
                message = self._consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                replies, _ = decode_items(message.value(), Reply)
                for reply in replies:
                    if reply.request_id >= FIRST_STORM_REQUEST_ID:
                        got.seconds.setdefault(reply.request_id, time.monotonic() - self._sent_s)
                        got.produced_ms[reply.request_id] = message.timestamp()[1]
        finally:
            self._consumer.close()
        return got


__all__ = ["ConnectAnswers", "ConnectStorm", "fill_region", "run_storm_clients"]
