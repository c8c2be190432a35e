"""MirrorMaker 2 (Apache Kafka's ``connect-mirror``) between ``bench.gateway``'s two
brokers, measured like the raw mirror: lag at a paced rate, then messages per second.

MM2 runs as a dedicated MirrorMaker process (``org.apache.kafka.connect.mirror.MirrorMaker``
from ``jvm/lib/kafka/``, which every bootstrap resolves) with one flow, site A → site B, and
one topic of 1 partition carrying the same stamped values as the raw mirror and the gateway
sender's events. Its consumer waits ``fetch.max.wait.ms`` as every other consumer of the run
and its producer lingers as the raw mirror's; everything else is MM2's default, as a user
would run it. MM2 names the copy ``a.<topic>`` on site B (its default replication policy).
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from bench.gateway_raw import (
    LINGER_MS,
    Arrivals,
    GatewayBenchOptions,
    PhaseResult,
    RawReader,
    measure_lag,
    measure_throughput,
)
from bench.peers.jvm import KAFKA_LIB, java
from bench.summary import SummaryRow
from bench.workers import stamped_value
from regionbus.schemas.kafka_clients import kafka_admin, kafka_producer
from regionbus.schemas.topics import TopicSpec, ensure_topics

MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
READY_TIMEOUT_S = 180.0
"""MM2 starts a Connect worker per flow and creates its internal topics: give it time."""


def mm2_properties(a_kafka: str, b_kafka: str, topic: str, fetch_wait_ms: int) -> str:
    """The ``mm2.properties`` of a one-way, one-topic flow from cluster ``a`` to ``b``.

    Args:
        a_kafka: Site A's bootstrap servers.
        b_kafka: Site B's bootstrap servers.
        topic: The topic mirrored.
        fetch_wait_ms: ``fetch.max.wait.ms`` of MM2's consumer on A.
    """
    single_broker = "\n".join(
        f"{name}.replication.factor = 1"
        for name in (
            "checkpoints.topic",
            "heartbeats.topic",
            "offset-syncs.topic",
            "offset.storage",
            "status.storage",
            "config.storage",
        )
    )
    return f"""clusters = a, b
a.bootstrap.servers = {a_kafka}
b.bootstrap.servers = {b_kafka}
a->b.enabled = true
a->b.topics = {topic}
b->a.enabled = false
replication.factor = 1
{single_broker}
emit.heartbeats.enabled = false
emit.checkpoints.enabled = false
sync.topic.configs.enabled = false
sync.topic.acls.enabled = false
sync.group.offsets.enabled = false
tasks.max = 1
a.consumer.fetch.max.wait.ms = {fetch_wait_ms}
b.producer.linger.ms = {LINGER_MS}
"""


@contextmanager
def mirror_maker(
    a_kafka: str, b_kafka: str, topic: str, fetch_wait_ms: int, log_dir: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A dedicated MirrorMaker 2 process mirroring ``topic`` from A to B, stopped at exit
    (SIGTERM, then SIGKILL after 20 s). Its output goes to ``log_dir/mirror-maker-2.log``.

    Raises:
        PeerSetupError: Java is missing.
    """
    config = log_dir / "mm2.properties"
    config.write_text(mm2_properties(a_kafka, b_kafka, topic, fetch_wait_ms), encoding="utf-8")
    with (log_dir / "mirror-maker-2.log").open("ab") as log_file:
        process = subprocess.Popen(
            [java(), "-Xmx512m", "-cp", f"{KAFKA_LIB}/*", MAIN, str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def mirror_maker_2(
    a_kafka: str, b_kafka: str, options: GatewayBenchOptions, log_dir: Path
) -> PhaseResult:
    """Lag and throughput of MirrorMaker 2 from A to B, measured as the raw mirror is.

    Raises:
        click.ClickException: MM2 did not mirror the first message in time, or lost some.
    """
    source = f"mm2.{secrets.token_hex(3)}"
    target = f"a.{source}"
    ensure_topics(kafka_admin({"bootstrap.servers": a_kafka}), [TopicSpec(source)])
    ensure_topics(kafka_admin({"bootstrap.servers": b_kafka}), [TopicSpec(target)])
    arrivals = Arrivals()
    reader = RawReader(b_kafka, target, arrivals, options.fetch_wait_ms)
    producer = kafka_producer(
        {
            "bootstrap.servers": a_kafka,
            "linger.ms": LINGER_MS,
            "acks": "all",
            "enable.idempotence": True,
        }
    )
    result = PhaseResult()
    try:
        with mirror_maker(a_kafka, b_kafka, source, options.fetch_wait_ms, log_dir) as process:
            producer.produce(source, stamped_value(options.value_bytes), partition=0)
            producer.flush(10)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while arrivals.count < 1:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise click.ClickException(
                        f"MirrorMaker 2 mirrored nothing; see {log_dir}/mirror-maker-2.log"
                    )
                time.sleep(0.1)
            measure_lag(producer, source, arrivals, options, result)
            measure_throughput(producer, source, arrivals, options, result)
    finally:
        reader.close()
    return result


def mirror_maker_rows(
    rb: PhaseResult, mm2: PhaseResult | None, options: GatewayBenchOptions
) -> list[SummaryRow]:
    """``bench.all`` rows whose baseline is MirrorMaker 2 (none when it did not run)."""
    if mm2 is None:
        return []
    return [
        SummaryRow(
            "gateway vs MirrorMaker 2",
            "events/s through one serial sender",
            rb.events_per_s,
            mm2.events_per_s,
            "MirrorMaker 2 events/s",
        ),
        SummaryRow(
            "gateway vs MirrorMaker 2",
            "events/s drained from a backlog by one serial sender",
            rb.drain_events_per_s,
            mm2.events_per_s,
            "MirrorMaker 2 events/s",
        ),
        SummaryRow(
            "gateway vs MirrorMaker 2",
            f"replication lag p99 at {options.rate}/s (ms)",
            rb.lag_p99_ms,
            mm2.lag_p99_ms,
            "MirrorMaker 2 lag p99",
            higher_is_better=False,
        ),
    ]


__all__ = ["mirror_maker", "mirror_maker_2", "mirror_maker_rows", "mm2_properties"]
