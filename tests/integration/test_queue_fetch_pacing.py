"""A busy subscription queue's consumer fetches once per ``queue_fetch_backoff_ms``, not
once per event, and an idle one fetches no more often than without the pacing.

The first tests check librdkafka's own behaviour with the settings
`regionbus.clients.subscription.queue_fetch_pacing` gives (a librdkafka upgrade that changed
it would fail them); the last checks that a client cache's queue consumer gets them, and
still receives every event in order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from support import Recorder, wait_until

import regionbus.clients.subscription as subscription
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.clients.subscription import queue_fetch_pacing
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.record_limits import CONSUMER_FETCH_MAX_BYTES
from regionbus.schemas.topics import TopicSpec, ensure_topics

_RECORDS = 100
_RATE_PER_S = 100
_BACKOFF_MS = 100
_FETCH_WAIT_MAX_MS = 500
_STATS_INTERVAL_MS = 100


class _PacedReader:
    """A consumer of partition 0 of ``topic`` read in a thread of its own, as the queue
    thread reads: block in ``poll`` for the first record, then take what is queued."""

    def __init__(self, bootstrap_servers: str, topic: str, pacing: dict[str, int]) -> None:
        self.received = 0
        self._fetches: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer: Consumer = kafka_consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"{topic}-{len(pacing)}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": _FETCH_WAIT_MAX_MS,
                "statistics.interval.ms": _STATS_INTERVAL_MS,
                "stats_cb": self._on_stats,
                **pacing,
            }
        )
        self._consumer.assign([TopicPartition(topic, 0, 0)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_stats(self, stats_json: str) -> None:
        stats = json.loads(stats_json)
        fetches = sum(broker.get("req", {}).get("Fetch", 0) for broker in stats["brokers"].values())
        with self._lock:
            self._fetches = fetches

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self._consumer.poll(0.1)
            if first is None:
                continue
            messages = [first, *self._consumer.consume(500, 0)]
            with self._lock:
                self.received += sum(1 for m in messages if m.error() is None)

    def fetches(self) -> int:
        """The fetch requests sent so far, from the first statistics report made after
        this call."""
        with self._lock:
            self._fetches = None
        wait_until(lambda: self._fetches is not None, what="a statistics report")
        with self._lock:
            assert self._fetches is not None
            return self._fetches

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()


@contextmanager
def _readers(bootstrap_servers: str, topic: str) -> Iterator[tuple[_PacedReader, _PacedReader]]:
    ensure_topics(kafka_admin({"bootstrap.servers": bootstrap_servers}), [TopicSpec(topic, 1)])
    paced = _PacedReader(bootstrap_servers, topic, queue_fetch_pacing(_BACKOFF_MS))
    plain = _PacedReader(bootstrap_servers, topic, queue_fetch_pacing(0))
    try:
        yield paced, plain
    finally:
        paced.close()
        plain.close()


def _fetches(paced: _PacedReader, plain: _PacedReader) -> tuple[int, int]:
    """Both readers' fetch requests so far."""
    return paced.fetches(), plain.fetches()


def test_pacing_off_keeps_librdkafkas_defaults() -> None:
    assert queue_fetch_pacing(0) == {}
    assert queue_fetch_pacing(20) == {
        "queued.min.messages": 1,
        "fetch.queue.backoff.ms": 20,
        "max.partition.fetch.bytes": CONSUMER_FETCH_MAX_BYTES,
    }


def test_a_busy_paced_consumer_fetches_once_per_backoff_not_once_per_record(
    kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = f"{namespace}.paced"
    with _readers(kafka_bootstrap_servers, topic) as (paced, plain):
        before = _fetches(paced, plain)
        producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers, "linger.ms": 0})
        for i in range(_RECORDS):
            producer.produce(topic, str(i).encode(), partition=0)
            producer.poll(0)
            # The writer's pace, not a wait for a condition: one record per 10 ms.
            time.sleep(1 / _RATE_PER_S)
        assert producer.flush(30) == 0
        wait_until(
            lambda: paced.received == plain.received == _RECORDS,
            timeout_s=60,
            what="both consumers to read every record",
        )
        after = _fetches(paced, plain)
    paced_fetches, plain_fetches = after[0] - before[0], after[1] - before[1]

    # 1 s of records: the paced consumer fetches about once per 100 ms (10-20 fetches), the
    # plain one about once per record (each fetch returns at the next record).
    assert paced_fetches * 2 < plain_fetches, (paced_fetches, plain_fetches)


def test_an_idle_paced_consumer_fetches_no_more_often_than_a_plain_one(
    kafka_bootstrap_servers: str, namespace: str
) -> None:
    topic = f"{namespace}.idle"
    with _readers(kafka_bootstrap_servers, topic) as (paced, plain):
        start = time.monotonic()
        before = _fetches(paced, plain)
        # Idle for 2 s: each consumer's fetch is held by the broker for fetch.wait.max.ms.
        wait_until(lambda: time.monotonic() - start >= 2.0, what="2 s to pass")
        after = _fetches(paced, plain)
        elapsed_s = time.monotonic() - start
    paced_fetches, plain_fetches = after[0] - before[0], after[1] - before[1]

    most = elapsed_s * 1000 / _FETCH_WAIT_MAX_MS + 2
    assert paced_fetches <= most, (paced_fetches, most)
    assert paced_fetches <= plain_fetches + 2, (paced_fetches, plain_fetches)


@pytest.fixture
def server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    with CacheServer(server_settings.model_copy(update={"regions": ["r"]})) as running:
        yield running


def test_a_client_caches_queue_consumer_is_paced_and_still_gets_every_event_in_order(
    server: CacheServer,
    client_factory: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configs: list[dict[str, Any]] = []
    real_kafka_consumer = subscription.kafka_consumer

    def recording_kafka_consumer(config: dict[str, Any]) -> Any:
        configs.append(dict(config))
        return real_kafka_consumer(config)

    monkeypatch.setattr(subscription, "kafka_consumer", recording_kafka_consumer)
    subscriber = client_factory(queue_fetch_backoff_ms=50)
    recorder = Recorder()
    subscriber.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    assert configs, "the subscription queue made no consumer"
    assert {k: configs[-1].get(k) for k in ("queued.min.messages", "fetch.queue.backoff.ms")} == {
        "queued.min.messages": 1,
        "fetch.queue.backoff.ms": 50,
    }

    writer = client_factory(subscription_enabled=False).create_region("r")
    for i in range(200):
        writer.put_async(f"k{i % 7}", i)
    writer.put("last", -1)
    wait_until(lambda: len(recorder.calls) >= 201, timeout_s=60, what="every event")
    # Each key's events in the order they were put (order is per bucket, not global).
    by_key: dict[str, list[Any]] = {}
    for _, key, value in recorder.calls:
        by_key.setdefault(key, []).append(value)
    assert by_key.pop("last") == [-1]
    assert by_key == {f"k{j}": list(range(j, 200, 7)) for j in range(7)}
