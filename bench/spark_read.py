"""Spark's JVM Kafka connector on regionbus topics against plain confluent-kafka, same run.

``python -m bench.spark_read --events 1000000`` fills a fresh ``{ns}.events`` (16
partitions, one encoded ``Event`` of about ``--value-bytes`` per record), then reads it
whole:

- **raw**: one confluent-kafka consumer, ``assign()`` on the 16 partitions from offset 0,
  counting records until every partition's end (its high watermark); no decoding;
- **spark raw bytes**: ``spark.read.format("kafka")`` over the topic (``local[2]``),
  aggregated in the JVM (``count(*)``, ``sum(length(value))``) so every row is built and
  none is collected; each Spark read runs twice and the figure is the second (warm) run;
- **spark typed columns**: the same read through :func:`regionbus.spark.decode.decode_messages`
  (``from_avro`` in the JVM), aggregating decoded columns so every record is decoded.

Then a bulk load of ``--entries`` entries into a fresh ``{ns}.ops`` (16 partitions):

- **confluent-kafka produce**: the very records the Spark job writes (collected first),
  produced by one confluent-kafka producer (``acks=all``, idempotent, ``linger.ms=5``) and
  flushed: the cost of the write alone;
- **python encode + produce**: one Python process encoding the same PUTs as ``put_all``
  does (JSON value, framed Avro operation, one batch per bucket) and producing them;
- **spark bulk load**: :func:`regionbus.spark.bulkload.entries_to_operations` (operations encoded in
  the Python workers, as a signing client must) written with ``df.write.format("kafka")``.

It prints rows/s of each and the ratios, and the load average before and after. Uses the
embedded Kafka of :class:`devstack.LocalStack`. See ``bench/README.md``.
"""

from __future__ import annotations

import os
import secrets
import time
from contextlib import ExitStack
from typing import Any

import click
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.summary import SummaryRow, emit
from regionbus.devstack import LocalStack
from regionbus.schemas.codec import encode, encode_batches
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.messages import Event, EventKind, Operation, OperationKind
from regionbus.schemas.naming import Topics, bucket_of
from regionbus.schemas.serializers import serializer_named
from regionbus.schemas.transport import assign_from

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
    i = 0
    progress.counts(lambda: f"{i:,} of {events:,} events produced")
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
    from regionbus.spark.kafka import latest_offsets

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

    from regionbus.spark.decode import decode_messages
    from regionbus.spark.format import kafka_reader

    started = time.monotonic()
    df = kafka_reader(spark, bootstrap).option("subscribe", topic).load()
    if decoded:
        # Decoded columns of several types, so every record goes through from_avro.
        row = (
            decode_messages(df)
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(F.length("key")).alias("key_bytes"),
                F.sum(F.col("sequence") + F.col("version")).alias("sum"),
                F.sum(F.length("value")).alias("value_bytes"),
            )
            .first()
        )
    else:
        row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("bytes")).first()
    assert row is not None
    return int(row["n"]), time.monotonic() - started


def _operations(spark: Any, namespace: str, entries: int) -> Any:
    from regionbus.spark.bulkload import entries_to_operations

    df = spark.range(entries, numPartitions=2).selectExpr(
        "concat('flight-', id) AS key",
        "named_struct('carrier', 'UA', 'flight', id, 'dep_delay', id % 60) AS value",
    )
    return entries_to_operations(
        df, "flights", namespace=namespace, total_buckets=_PARTITIONS, load_id="spark-load-bench"
    )


def _raw_produce(bootstrap: str, records: list[tuple[str, int, bytes]]) -> float:
    producer = kafka_producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True}
    )
    started = time.monotonic()
    for topic, partition, value in records:
        while True:
            try:
                producer.produce(topic, value, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    return time.monotonic() - started


def _encode_and_produce(bootstrap: str, namespace: str, entries: int) -> float:
    """What one Python process does for the same load: encode each PUT as ``put_all`` does
    (JSON value, framed Avro operation, one batch per bucket) and produce."""
    serializer = serializer_named("json")
    started = time.monotonic()
    now_ms = int(time.time() * 1000)
    per_bucket: dict[int, list[bytes]] = {}
    for i in range(entries):
        key = f"flight-{i}"
        bucket = bucket_of("flights", key, _PARTITIONS)
        sequence = len(per_bucket.setdefault(bucket, []))
        operation = Operation(
            request_id=i,
            client_id="spark-load-baseline",
            kind=OperationKind.PUT,
            region="flights",
            timestamp_ms=now_ms,
            event_id=EventID("spark-load-baseline-p0", 1, sequence, bucket),
            key=key,
            value=serializer.dumps({"carrier": "UA", "flight": i, "dep_delay": i % 60}),
            serializer=serializer.name,
        )
        per_bucket[bucket].append(encode(operation))
    ops = Topics(namespace).ops
    records = [
        (ops, bucket, message)
        for bucket, framed in per_bucket.items()
        for message in encode_batches(framed)
    ]
    _raw_produce(bootstrap, records)
    return time.monotonic() - started


def _bulk_load(spark: Any, bootstrap: str, entries: int) -> tuple[float, float, float, int]:
    """Seconds of one load of ``entries`` PUTs: (produce of the encoded records, encode and
    produce in one Python process, Spark bulk load) and the number of Kafka records."""
    from regionbus.spark.format import kafka_writer

    namespace = f"bench.{secrets.token_hex(3)}"
    ops = Topics(namespace).ops
    admin = kafka_admin({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(ops, _PARTITIONS, 1)]).values():
        future.result(timeout=30)
    records = [
        (r["topic"], r["partition"], r["value"])
        for r in _operations(spark, namespace, entries).collect()
    ]
    raw_s = _raw_produce(bootstrap, records)
    encode_s = _encode_and_produce(bootstrap, namespace, entries)
    started = time.monotonic()
    kafka_writer(_operations(spark, namespace, entries), bootstrap).save()
    spark_s = time.monotonic() - started
    return raw_s, encode_s, spark_s, len(records)


@click.command()
@click.option("--events", default=1_000_000, show_default=True, help="Events in the topic.")
@click.option("--value-bytes", default=200, show_default=True, help="Approximate record size.")
@click.option("--entries", default=300_000, show_default=True, help="Entries bulk loaded.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
def main(events: int, value_bytes: int, entries: int, master: str) -> None:
    """Spark's Kafka connector vs plain confluent-kafka: reads and a bulk load, in one run."""
    console = Console()
    load_before = os.getloadavg()
    with progress.heartbeat(console), ExitStack() as stack:
        progress.log_dir("spark_read", console)
        local = stack.enter_context(LocalStack(use_docker=False))
        stack.enter_context(progress.keep_stack_logs(local))
        bootstrap = local.kafka_bootstrap_servers
        topic = Topics(f"bench.{secrets.token_hex(3)}").events
        progress.phase(console, f"filling {topic}: {events:,} events ...")
        fill_s = _fill(bootstrap, topic, events, value_bytes)
        console.print(f"filled {topic}: {events:,} events in {fill_s:.1f} s")
        progress.phase(console, "confluent-kafka: reading the topic ...")
        raw_n, raw_s = _raw_consume(bootstrap, topic)
        progress.phase(console, f"spark: starting ({master}), then reading the topic twice ...")

        from regionbus.spark.session import local_session

        spark = local_session("regionbus-bench", master=master)
        # Each read runs twice and the second (warm: the JVM's JIT has compiled the
        # connector's and spark-avro's code) is the figure; first runs are printed too.
        runs = []
        for name, decoded in (("spark raw bytes", False), ("spark typed columns", True)):
            _, first_s = _spark_read(spark, bootstrap, topic, decoded=decoded)
            console.print(f"{name}: first run {first_s:.2f} s")
            runs.append((name, *_spark_read(spark, bootstrap, topic, decoded=decoded)))
        progress.phase(console, f"bulk load: {entries:,} entries, raw and through spark ...")
        _bulk_load(spark, bootstrap, min(entries, 20_000))  # warms the Python workers
        produce_s, encode_s, load_s, records = _bulk_load(spark, bootstrap, entries)
        spark.stop()
    load_after = os.getloadavg()
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
    loads = Table(title=f"bulk load of {entries:,} PUT operations ({records:,} batch records)")
    for column in ("writer", "seconds", "operations/s", "÷ produce"):
        loads.add_column(column, justify="right")
    produce_rate, load_rate = entries / produce_s, entries / load_s
    for name, seconds in (
        ("confluent-kafka produce (encoded records)", produce_s),
        ("python encode + confluent-kafka produce", encode_s),
        ("spark bulk load", load_s),
    ):
        rate = entries / seconds
        loads.add_row(name, f"{seconds:.2f}", f"{rate:,.0f}", f"{rate / produce_rate:.2f}")
    console.print(loads)
    console.print(
        "load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in load_after)
    )
    emit(
        [
            *(
                SummaryRow(
                    "spark_read", f"{name} rows/s", n / seconds, raw_rate, "confluent-kafka consume"
                )
                for name, n, seconds in runs
            ),
            SummaryRow(
                "spark_read",
                "bulk load operations/s",
                load_rate,
                produce_rate,
                "confluent-kafka produce of the encoded records",
            ),
            SummaryRow(
                "spark_read",
                "bulk load operations/s",
                load_rate,
                entries / encode_s,
                "python encode + confluent-kafka produce",
            ),
        ]
    )
    if raw_n != events or any(n != events for _, n, _ in runs):
        raise click.ClickException("a reader did not see every event")


if __name__ == "__main__":
    main()
