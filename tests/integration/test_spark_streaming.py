"""Structured Streaming over a regionbus topic with Spark's JVM Kafka connector: restarts
lose and repeat nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import NewTopic

from regionbus.schemas.kafka_clients import kafka_admin, kafka_producer
from regionbus.schemas.naming import Topics
from regionbus.spark.format import JVM_FORMAT, kafka_format

_DRIVER = Path(__file__).with_name("spark_stream_driver.py")
_DRIVER_TIMEOUT_S = 240
_PARTITIONS = 2


def _topic_with(bootstrap: str, topic: str) -> None:
    admin = kafka_admin({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, _PARTITIONS, 1)]).values():
        future.result(timeout=15)


def _produce(bootstrap: str, topic: str, first: int, count: int) -> set[tuple[int, int]]:
    producer = kafka_producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    acked: set[tuple[int, int]] = set()

    def on_delivery(error: Any, message: Any) -> None:
        assert error is None, error
        acked.add((message.partition(), message.offset()))

    for i in range(first, first + count):
        producer.produce(
            topic, f"v{i}".encode(), partition=i % _PARTITIONS, on_delivery=on_delivery
        )
    assert producer.flush(30) == 0
    return acked


def _table(spark: Any, path: Path) -> list[tuple[int, int]]:
    """Every (partition, offset) in a file-sink table, read through its metadata log (so
    files of an uncommitted batch are not counted)."""
    if not (path / "_spark_metadata").exists():
        return []
    table = spark.read.schema("partition int, offset bigint, value binary").parquet(str(path))
    return [(r.partition, r.offset) for r in table.collect()]


def test_stream_stopped_and_restarted_from_its_checkpoint_loses_and_repeats_nothing(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str, tmp_path: Path
) -> None:
    topic = Topics(namespace).events
    _topic_with(kafka_bootstrap_servers, topic)
    produced = _produce(kafka_bootstrap_servers, topic, 0, 500)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    assert kafka_format(spark_session) == JVM_FORMAT

    def run_until_caught_up(expected: int) -> Any:
        stream = (
            spark_session.readStream.format(kafka_format(spark_session))
            .option("kafka.bootstrap.servers", kafka_bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "150")
            .load()
            .select("partition", "offset", "value")
        )
        query = (
            stream.writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        deadline = time.monotonic() + 120
        while len(_table(spark_session, output)) < expected:
            assert time.monotonic() < deadline, "stream did not catch up"
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
        query.stop()
        return query

    first = run_until_caught_up(500)
    produced |= _produce(kafka_bootstrap_servers, topic, 500, 400)
    second = run_until_caught_up(900)

    rows = _table(spark_session, output)
    assert len(rows) == len(set(rows)), "a record was written twice"
    assert set(rows) == produced
    # maxOffsetsPerTrigger cut the backlog into micro-batches of at most 150 records.
    batches = [p for q in (first, second) for p in q.recentProgress if p["numInputRows"]]
    assert len(batches) >= 6
    assert max(p["numInputRows"] for p in batches) <= 150
    assert second.recentProgress[0]["batchId"] > first.lastProgress["batchId"]


def test_kill_9_of_the_driver_mid_batch_then_restart_loses_nothing(
    spark_session: Any, kafka_bootstrap_servers: str, namespace: str, tmp_path: Path
) -> None:
    topic = Topics(namespace).events
    _topic_with(kafka_bootstrap_servers, topic)
    produced = _produce(kafka_bootstrap_servers, topic, 0, 1_000)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stalled = tmp_path / "stalled"
    command = [sys.executable, str(_DRIVER), kafka_bootstrap_servers, topic]
    command += [str(output), str(checkpoint)]
    log = (tmp_path / "driver.log").open("wb")

    # The driver (Python process, its JVM and Python workers) in a process group of its own.
    driver = subprocess.Popen(
        [*command, str(stalled)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + _DRIVER_TIMEOUT_S
        while not stalled.exists():
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the driver never reached its third batch"
            time.sleep(0.2)
        os.killpg(driver.pid, signal.SIGKILL)
    finally:
        driver.wait(30)
    written_before_restart = _table(spark_session, output)
    assert 0 < len(written_before_restart) < 1_000
    assert driver.returncode == -signal.SIGKILL

    restarted = subprocess.run(
        command, stdout=log, stderr=subprocess.STDOUT, timeout=_DRIVER_TIMEOUT_S, check=False
    )

    assert restarted.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
    assert (tmp_path / "driver.log").read_text().count(f"reading with format {JVM_FORMAT}") == 2
    rows = _table(spark_session, output)
    assert len(rows) == len(set(rows)), "a record was written twice"
    assert set(rows) == produced
