"""Spark batch read of ``{ns}.events`` against a plain confluent-kafka consume, same run.

``python -m bench.spark_read --events 1000000`` fills a fresh ``{ns}.events`` (16
partitions, one encoded ``Event`` of about ``--value-bytes`` per record), then reads it
whole:

- **raw**: one confluent-kafka consumer, ``assign()`` on the 16 partitions from offset 0,
  counting records until every partition's end (its high watermark, as the Spark source
  takes it, :func:`spark.kafka.latest_offsets`); no decoding;
- **spark**: ``spark.read.format(kafka_format(spark))`` over the topic (``local[2]``),
  aggregated in the JVM (``count(*)``, ``sum(length(value))``) so every row is built and
  none is collected; run twice, the second run with warm Python workers;
- **spark + decode**: the same read through :func:`spark.decode.decode_messages`.

It prints rows/s of each and spark ÷ raw. Uses ``KAFKA_BOOTSTRAP_SERVERS`` when set, else
the embedded Kafka. See ``bench/README.md``.
"""

from __future__ import annotations

import secrets
import time
from contextlib import ExitStack
from typing import Any

import click
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from rich.console import Console
from rich.table import Table

from bench.summary import SummaryRow, emit
from devstack import LocalStack
from schemas.codec import encode
from schemas.eventid import EventID
from schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from schemas.messages import Event, EventKind
from schemas.naming import Topics
from schemas.transport import assign_from

_PARTITIONS = 16


def _fill(bootstrap: str, topic: str, events: int, value_bytes: int) -> float:
    admin = kafka_admin({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, _PARTITIONS, 1)]).values():
        future.result(timeout=30)
    producer = kafka_producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True}
    )
    payload = b"x" * max(0, value_bytes - 120)
    started = time.monotonic()
    for i in range(events):
        bucket = i % _PARTITIONS
        event = Event(
            EventID("bench", 1, i, bucket), EventKind.CREATE, "bench", i, 0, "c", f"k{i}", payload
        )
        while True:
            try:
                producer.produce(topic, encode(event), partition=bucket)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    return time.monotonic() - started


def _raw_consume(bootstrap: str, topic: str) -> tuple[int, float]:
    from spark.kafka import latest_offsets

    ends = latest_offsets(
        {"bootstrap.servers": bootstrap}, [(topic, p) for p in range(_PARTITIONS)]
    )
    consumer = kafka_consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{secrets.token_hex(4)}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    started = time.monotonic()
    assign_from(consumer, [TopicPartition(topic, p, 0) for p in range(_PARTITIONS)], 10)
    remaining = {p: ends[(topic, p)] for p in range(_PARTITIONS) if ends[(topic, p)] > 0}
    count = 0
    while remaining:
        for message in consumer.consume(10_000, 1.0):
            if message.error() is not None:
                continue
            count += 1
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            if offset + 1 >= remaining.get(partition, 0):
                remaining.pop(partition, None)
    elapsed = time.monotonic() - started
    consumer.close()
    return count, elapsed


def _spark_read(spark: Any, bootstrap: str, topic: str, decoded: bool) -> tuple[int, float]:
    from pyspark.sql import functions as F  # noqa: N812

    from spark.decode import decode_messages
    from spark.format import kafka_format

    started = time.monotonic()
    df = (
        spark.read.format(kafka_format(spark))
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
    )
    if decoded:
        df = decode_messages(df).withColumn("value", F.col("key"))
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("bytes")).first()
    return int(row["n"]), time.monotonic() - started


@click.command()
@click.option("--events", default=1_000_000, show_default=True, help="Events in the topic.")
@click.option("--value-bytes", default=200, show_default=True, help="Approximate record size.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
def main(events: int, value_bytes: int, master: str) -> None:
    """Spark batch read of {ns}.events vs a plain confluent-kafka consume, in one run."""
    console = Console()
    with ExitStack() as stack:
        local = stack.enter_context(LocalStack(use_docker=False))
        bootstrap = local.kafka_bootstrap_servers
        topic = Topics(f"bench.{secrets.token_hex(3)}").events
        fill_s = _fill(bootstrap, topic, events, value_bytes)
        console.print(f"filled {topic}: {events:,} events in {fill_s:.1f} s")
        raw_n, raw_s = _raw_consume(bootstrap, topic)

        from spark.session import local_session

        spark = local_session("regionbus-bench", master=master)
        runs = [
            ("spark (first run)", *_spark_read(spark, bootstrap, topic, decoded=False)),
            ("spark (warm)", *_spark_read(spark, bootstrap, topic, decoded=False)),
            ("spark + decode_messages", *_spark_read(spark, bootstrap, topic, decoded=True)),
        ]
        spark.stop()
    raw_rate = raw_n / raw_s
    table = Table(
        title=f"batch read of {events:,} events ({value_bytes} B), {_PARTITIONS} partitions"
    )
    for column in ("reader", "rows", "seconds", "rows/s", "÷ raw"):
        table.add_column(column, justify="right")
    table.add_row("confluent-kafka", f"{raw_n:,}", f"{raw_s:.2f}", f"{raw_rate:,.0f}", "1.00")
    for name, n, seconds in runs:
        rate = n / seconds
        table.add_row(name, f"{n:,}", f"{seconds:.2f}", f"{rate:,.0f}", f"{rate / raw_rate:.2f}")
    console.print(table)
    emit(
        [
            SummaryRow(
                "spark_read",
                f"{name} rows/s",
                n / seconds,
                raw_rate,
                "confluent-kafka consume rows/s",
            )
            for name, n, seconds in runs[1:]
        ]
    )
    if raw_n != events or any(n != events for _, n, _ in runs):
        raise click.ClickException("a reader did not see every event")


if __name__ == "__main__":
    main()
