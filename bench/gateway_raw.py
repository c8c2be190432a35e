"""The gateway benchmark's shared figures and its raw baseline: the options of a run, the
arrival recorder every receiving side uses, and the raw consume → produce mirror between
the two sites' brokers that regionbus's gateway sender and MirrorMaker 2 are compared with.
"""

from __future__ import annotations

import multiprocessing
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click
from confluent_kafka import TopicPartition

from bench import progress
from bench.report import percentile
from bench.workers import TIMESTAMP_BYTES, stamped_value
from regionbus.broker.config import ServerSettings
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.topics import TopicSpec, ensure_topics
from regionbus.schemas.transport import assign_from

LINGER_MS = ServerSettings.model_fields["linger_ms"].default


@dataclass(frozen=True)
class GatewayBenchOptions:
    """What one run measures.

    Attributes:
        events: Events for the throughput phase.
        rate: Puts (messages) per second in the lag phase.
        seconds: Length of the lag phase, in seconds, its warm-up included.
        warmup_seconds: First seconds of the lag phase not counted. 30 s, because the
            brokers are started for the run and their JVMs compile the request paths for
            the first tens of seconds: over a 20 s lag phase started on fresh brokers, the
            C1/C2 compiler threads took 47 % of both brokers' CPU (13 % from 30 to 50 s),
            on a 2-core machine that the gateway path at 500 events/s fills, so the
            figures measured the compiler (bench/RESULTS.md, "bench.gateway on warm
            brokers").
        value_bytes: Value size in bytes (the first 8 are the send time).
        batch_size: The sender's ``batch_size`` (Geode default 100).
        batch_time_interval_ms: The sender's ``batch_time_interval_ms`` (Geode default 1000).
        fetch_wait_ms: ``fetch.wait.max.ms`` of every consumer (servers, sender, receiver,
            clients, mirror, readers).
    """

    events: int = 20_000
    rate: int = 500
    seconds: float = 50.0
    warmup_seconds: float = 30.0
    value_bytes: int = 200
    batch_size: int = 100
    batch_time_interval_ms: int = 1000
    fetch_wait_ms: int = ServerSettings.model_fields["fetch_wait_max_ms"].default


@dataclass
class PhaseResult:
    """Events per second of a throughput phase and lag percentiles (ms) of a lag phase.

    ``source_events_per_s`` is the regionbus run's only: puts acked per second by site A's
    server in the throughput phase (first put to the last put's reply), the pace at which
    events enter the sender's queue; ``events_per_s`` cannot exceed it.
    ``drain_events_per_s`` is the regionbus run's only too: events per second from the first
    to the last arrival on site B of a backlog queued on site A while no sender ran, so
    site A's puts do not bound it (sender, receiver and site B's server do).
    """

    events_per_s: float = 0.0
    lag_p50_ms: float = float("nan")
    lag_p99_ms: float = float("nan")
    lag_max_ms: float = float("nan")
    lag_samples: int = 0
    source_events_per_s: float = float("nan")
    drain_events_per_s: float = float("nan")


class Arrivals:
    """Counts arrivals and records lag (now - stamped send time) after a start time."""

    def __init__(self) -> None:
        self.count = 0
        self.first_ns = 0
        self.last_ns = 0
        self.lags_ms: list[float] = []
        self.count_from_ns = 0
        self._lock = threading.Lock()

    def hit(self, value: bytes | None) -> None:
        now = time.time_ns()
        with self._lock:
            self.count += 1
            self.first_ns = self.first_ns or now
            self.last_ns = now
            if value is not None and len(value) >= TIMESTAMP_BYTES:
                sent = int.from_bytes(value[:TIMESTAMP_BYTES], "big")
                if sent >= self.count_from_ns:
                    self.lags_ms.append((now - sent) / 1e6)

    def reset(self, count_from_ns: int) -> None:
        with self._lock:
            self.count = 0
            self.first_ns = 0
            self.lags_ms = []
            self.count_from_ns = count_from_ns


def pace(rate: int, seconds: float) -> Iterator[int]:
    """Yield indexes at ``rate`` per second for ``seconds`` (catching up when late)."""
    total = int(rate * seconds)
    start = time.monotonic()
    index = 0
    progress.counts(lambda: f"{index:,} of {total:,} sent")
    for index in range(total):
        due = start + index / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield index


def wait_count(arrivals: Arrivals, expected: int, idle_timeout_s: float = 60.0) -> None:
    last, last_change = -1, time.monotonic()
    progress.counts(lambda: f"{arrivals.count:,} of {expected:,} arrived")
    while arrivals.count < expected:
        if arrivals.count != last:
            last, last_change = arrivals.count, time.monotonic()
        elif time.monotonic() - last_change > idle_timeout_s:
            raise click.ClickException(f"only {arrivals.count} of {expected} arrived")
        time.sleep(0.02)


def lag_result(arrivals: Arrivals) -> PhaseResult:
    lags = sorted(arrivals.lags_ms)
    return PhaseResult(
        lag_p50_ms=percentile(lags, 0.5),
        lag_p99_ms=percentile(lags, 0.99),
        lag_max_ms=lags[-1] if lags else float("nan"),
        lag_samples=len(lags),
    )


# --- the raw mirror ------------------------------------------------------------------


def mirror_main(
    source: str, source_topic: str, target: str, target_topic: str, fetch_wait_ms: int, stop: Any
) -> None:
    """The raw baseline (child process): consume ``source_topic`` on ``source`` with
    ``assign()`` and produce each message as is to ``target_topic`` on ``target``."""
    consumer = kafka_consumer(
        {
            "bootstrap.servers": source,
            "group.id": f"mirror-{secrets.token_hex(3)}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": fetch_wait_ms,
        }
    )
    assign_from(consumer, [TopicPartition(source_topic, 0, 0)], 10)
    producer = kafka_producer(
        {
            "bootstrap.servers": target,
            "linger.ms": LINGER_MS,
            "acks": "all",
            "enable.idempotence": True,
        }
    )
    while not stop.is_set():
        first = consumer.poll(0.1)
        if first is None:
            continue
        for message in [first, *consumer.consume(500, 0)]:
            if message.error() is None:
                while True:
                    try:
                        producer.produce(target_topic, message.value(), partition=0)
                        break
                    except BufferError:
                        producer.poll(0.05)
        producer.poll(0)
    producer.flush(10)
    consumer.close()


class RawReader:
    """Reads a topic on site B in a thread, recording arrivals."""

    def __init__(self, bootstrap: str, topic: str, arrivals: Arrivals, fetch_wait_ms: int) -> None:
        self._consumer = kafka_consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"reader-{secrets.token_hex(3)}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": fetch_wait_ms,
            }
        )
        assign_from(self._consumer, [TopicPartition(topic, 0, 0)], 10)
        self._arrivals = arrivals
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self._consumer.poll(0.1)
            if first is None:
                continue
            for message in [first, *self._consumer.consume(500, 0)]:
                if message.error() is None:
                    self._arrivals.hit(message.value())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def measure_lag(
    producer: Any, topic: str, arrivals: Arrivals, options: GatewayBenchOptions, result: PhaseResult
) -> None:
    """The lag phase of a mirror: stamped values produced to ``topic`` at ``options.rate``
    for ``options.seconds``; fills ``result``'s lag percentiles from what ``arrivals`` saw
    on the far side after the warm-up.

    Raises:
        click.ClickException: Not every value arrived (``wait_count``).
    """
    arrivals.reset(time.time_ns() + int(options.warmup_seconds * 1e9))
    count = 0
    for _ in pace(options.rate, options.seconds):
        producer.produce(topic, stamped_value(options.value_bytes), partition=0)
        producer.poll(0)
        count += 1
    producer.flush(10)
    wait_count(arrivals, count)
    lag = lag_result(arrivals)
    result.lag_p50_ms, result.lag_p99_ms = lag.lag_p50_ms, lag.lag_p99_ms
    result.lag_max_ms, result.lag_samples = lag.lag_max_ms, lag.lag_samples


def measure_throughput(
    producer: Any, topic: str, arrivals: Arrivals, options: GatewayBenchOptions, result: PhaseResult
) -> None:
    """The throughput phase of a mirror: ``options.events`` values produced to ``topic`` as
    fast as the producer takes them; sets ``result.events_per_s`` (first produce to last
    arrival on the far side).

    Raises:
        click.ClickException: Not every value arrived (``wait_count``).
    """
    arrivals.reset(0)
    start_ns = time.time_ns()
    for _ in range(options.events):
        while True:
            try:
                producer.produce(topic, stamped_value(options.value_bytes), partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(30)
    wait_count(arrivals, options.events)
    result.events_per_s = options.events / ((arrivals.last_ns - start_ns) / 1e9)


def raw_mirror(a_kafka: str, b_kafka: str, options: GatewayBenchOptions) -> PhaseResult:
    """Lag and throughput of the raw consume → produce mirror from A to B."""
    tag = secrets.token_hex(3)
    result = PhaseResult()
    for phase in ("lag", "throughput"):
        source, target = f"mirror.{tag}.{phase}.a", f"mirror.{tag}.{phase}.b"
        ensure_topics(kafka_admin({"bootstrap.servers": a_kafka}), [TopicSpec(source)])
        ensure_topics(kafka_admin({"bootstrap.servers": b_kafka}), [TopicSpec(target)])
        arrivals = Arrivals()
        reader = RawReader(b_kafka, target, arrivals, options.fetch_wait_ms)
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        mirror = context.Process(
            target=mirror_main,
            args=(a_kafka, source, b_kafka, target, options.fetch_wait_ms, stop),
            daemon=True,
        )
        mirror.start()
        producer = kafka_producer(
            {
                "bootstrap.servers": a_kafka,
                "linger.ms": LINGER_MS,
                "acks": "all",
                "enable.idempotence": True,
            }
        )
        try:
            producer.produce(source, stamped_value(options.value_bytes), partition=0)
            producer.flush(10)
            wait_count(arrivals, 1)  # the mirror runs
            if phase == "lag":
                measure_lag(producer, source, arrivals, options, result)
            else:
                measure_throughput(producer, source, arrivals, options, result)
        finally:
            stop.set()
            mirror.join(20)
            reader.close()
    return result
